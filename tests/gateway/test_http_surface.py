"""The HTTP surface around the generate routes: unknown fields, request ids, API key, CORS,
root path, size limit and several served model names."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from gateway.config import GatewayConfig
from gateway.middleware import BodySizeLimitMiddleware
from tests.gateway.conftest import FakeRouter
from turnout.security import ServiceSecurity

CHAT = [{"role": "user", "content": "Hi"}]
MakeClient = Callable[[GatewayConfig], AsyncIterator[httpx.AsyncClient]]


async def test_unknown_fields_are_ignored_with_one_warning(
    client: httpx.AsyncClient, fake_router: FakeRouter, caplog: pytest.LogCaptureFixture
) -> None:
    body = {"messages": [{**CHAT[0], "x_tag": 1}], "frobnicate": 1, "stream_options": None, "vendor": {"a": 1}}
    with caplog.at_level(logging.WARNING, logger="gateway.request_id"):
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    warnings = [r for r in caplog.records if r.getMessage() == "ignoring unknown fields"]
    assert len(warnings) == 1
    assert warnings[0].fields == ["frobnicate", "vendor", "messages[0].x_tag"]  # type: ignore[attr-defined]
    assert len(fake_router.requests) == 1
    completion = await client.post("/v1/completions", json={"prompt": "x", "frobnicate": True})
    assert completion.status_code == 200, completion.text
    native = await client.post("/generate", json={"text": "x", "frobnicate": True})
    assert native.status_code == 200, native.text


async def test_unknown_sampling_param_of_generate_is_400(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    # SGLang builds SamplingParams(**sampling_params), which refuses unknown names.
    response = await client.post("/generate", json={"text": "x", "sampling_params": {"temprature": 0.5}})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "sampling_params.temprature"
    assert fake_router.requests == []


async def test_x_request_id_is_the_router_request_id_and_is_echoed(
    client: httpx.AsyncClient, fake_router: FakeRouter
) -> None:
    headers = {"X-Request-Id": "trace-42"}
    chat = await client.post("/v1/chat/completions", json={"messages": CHAT, "request_id": "body"}, headers=headers)
    assert chat.headers["x-request-id"] == "trace-42"
    assert chat.json()["id"] == "chatcmpl-trace-42"
    assert fake_router.requests[-1].request_id == "trace-42"

    batch = await client.post("/v1/completions", json={"prompt": ["a", "b"]}, headers=headers)
    assert batch.headers["x-request-id"] == "trace-42"
    assert [r.request_id for r in fake_router.requests[-2:]] == ["trace-42-0", "trace-42-1"]

    native = await client.post("/generate", json={"text": "x", "rid": "mine"}, headers=headers)
    assert native.json()["meta_info"]["id"] == "trace-42"
    assert fake_router.requests[-1].request_id == "trace-42"

    # Without the header: the body's id, else a new one; echoed either way.
    by_body = await client.post("/v1/completions", json={"prompt": "x", "request_id": "b-7"})
    assert by_body.headers["x-request-id"] == "b-7" and fake_router.requests[-1].request_id == "b-7"
    generated = await client.post("/v1/completions", json={"prompt": "x"})
    assert generated.headers["x-request-id"] == fake_router.requests[-1].request_id
    assert generated.json()["id"] == f"cmpl-{fake_router.requests[-1].request_id}"
    # Streams and errors carry it too.
    stream = await client.post("/v1/completions", json={"prompt": "x", "stream": True}, headers=headers)
    assert stream.headers["x-request-id"] == "trace-42"
    error = await client.post("/v1/completions", json={"prompt": 1}, headers=headers)
    assert error.status_code == 400 and error.headers["x-request-id"] == "trace-42"


async def test_api_key(fake_router: FakeRouter, make_client: MakeClient) -> None:
    config = GatewayConfig(router_address=fake_router.address, security=ServiceSecurity(api_keys=("k1", "k2")))
    async for client in make_client(config):
        for path in ("/v1/models", "/tokenize", "/get_server_info"):
            missing = await client.get(path)
            assert missing.status_code == 401, path
            assert missing.json()["error"]["type"] == "authentication_error"
            assert missing.headers["www-authenticate"] == "Bearer"
        wrong = await client.post("/generate", json={"text": "x"}, headers={"Authorization": "Bearer k3"})
        assert wrong.status_code == 401
        assert fake_router.requests == []
        for key in ("k1", "k2"):
            ok = await client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
            assert ok.status_code == 200
        # Probes stay open, and so do CORS preflights.
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/version")).status_code == 200
        preflight = await client.options(
            "/v1/chat/completions",
            headers={"Origin": "https://app.example", "Access-Control-Request-Method": "POST"},
        )
        assert preflight.status_code == 200


async def test_cors_options(fake_router: FakeRouter, make_client: MakeClient) -> None:
    config = GatewayConfig(
        router_address=fake_router.address,
        allowed_origins=("https://app.example",),
        allowed_methods=("GET", "POST"),
        allow_credentials=True,
    )
    headers = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    async for client in make_client(config):
        preflight = await client.options("/v1/completions", headers=headers)
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "https://app.example"
        assert preflight.headers["access-control-allow-credentials"] == "true"
        other = await client.options("/v1/completions", headers={**headers, "Origin": "https://evil.example"})
        assert other.status_code == 400
        response = await client.get("/v1/models", headers={"Origin": "https://app.example"})
        assert response.headers["access-control-allow-origin"] == "https://app.example"


async def test_root_path(fake_router: FakeRouter, make_client: MakeClient) -> None:
    async for client in make_client(GatewayConfig(router_address=fake_router.address, root_path="/llm")):
        # Behind a proxy that keeps the prefix, and one that strips it.
        assert (await client.get("/llm/v1/models")).status_code == 200
        assert (await client.get("/v1/models")).status_code == 200
        openapi = (await client.get("/llm/openapi.json")).json()
        assert openapi["servers"] == [{"url": "/llm"}]


async def test_request_size_limit_is_413(fake_router: FakeRouter, make_client: MakeClient) -> None:
    async for client in make_client(GatewayConfig(router_address=fake_router.address, max_request_bytes=200)):
        small = await client.post("/v1/completions", json={"prompt": "x"})
        assert small.status_code == 200
        big = await client.post("/v1/completions", json={"prompt": "x" * 300})
        assert big.status_code == 413
        assert "--max-request-bytes" in big.json()["error"]["message"]

        async def chunked() -> AsyncIterator[bytes]:
            # No Content-Length: the limit applies while the body is read.
            yield b'{"prompt": "'
            for _ in range(10):
                yield b"x" * 50
            yield b'"}'

        streamed = await client.post("/v1/completions", content=chunked(), headers={"Content-Type": "application/json"})
        assert streamed.status_code == 413, streamed.text
        assert len(fake_router.requests) == 1


async def test_declared_length_over_the_limit_is_refused_before_reading() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("the app must not run")

    async def receive() -> Any:
        raise AssertionError("the body must not be read")

    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [(b"content-length", b"201")]}
    await BodySizeLimitMiddleware(app, 200)(scope, receive, send)
    assert sent[0]["status"] == 413


async def test_several_served_model_names(fake_router: FakeRouter, make_client: MakeClient) -> None:
    config = GatewayConfig(router_address=fake_router.address, served_model_names=("first", "org/second"))
    async for client in make_client(config):
        models = (await client.get("/v1/models")).json()["data"]
        assert [m["id"] for m in models] == ["first", "org/second"]
        assert all(m["max_model_len"] == 2048 and m["root"] == "/models/tiny" for m in models)
        assert (await client.get("/v1/models/org/second")).status_code == 200
        assert (await client.get("/v1/models/tiny")).status_code == 404
        for name in ("org/second", None):
            body: dict[str, Any] = {"prompt": "x"} if name is None else {"prompt": "x", "model": name}
            reply = await client.post("/v1/completions", json=body)
            # vLLM: responses report the first name; the router gets its default model.
            assert reply.json()["model"] == "first"
            assert fake_router.requests[-1].model == ""
        unknown = await client.post("/v1/completions", json={"prompt": "x", "model": "nope"})
        assert unknown.status_code == 404


def test_flags_make_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.main import config_from_args, parse_args

    monkeypatch.delenv("TURNOUT_API_KEY", raising=False)
    argv = ["--router", "r:1", "--served-model-name", "a", "org/b", "--api-key", "k1", "--api-key", "k2"]
    argv += ["--allowed-origins", '["https://x.example"]', "--allowed-methods", "GET,POST", "--allow-credentials"]
    argv += ["--root-path", "/llm", "--max-request-bytes", "1000"]
    args = parse_args(argv)
    config = config_from_args(args)
    assert config.served_model_names == ("a", "org/b") and config.security.api_keys == ("k1", "k2")
    assert config.allowed_origins == ("https://x.example",) and config.allowed_methods == ("GET", "POST")
    assert config.allow_credentials and config.root_path == "/llm" and config.max_request_bytes == 1000
    assert "k1" not in repr(config)
    monkeypatch.setenv("TURNOUT_API_KEY", "from-env")
    assert config_from_args(parse_args(["--router", "r:1"])).security.api_keys == ("from-env",)
    with pytest.raises(ValueError, match="root_path"):
        config_from_args(parse_args(["--router", "r:1", "--root-path", "llm/"]))
