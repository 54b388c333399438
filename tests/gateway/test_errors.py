"""Errors as HTTP: 400 (never 422) for bad requests, refused parameters, gRPC status mapping, mid-stream errors."""

from __future__ import annotations

from typing import Any

import grpc
import httpx
import pytest

from tests.gateway.conftest import FakeRouter, chunk, complete, sse_events

CHAT = [{"role": "user", "content": "Hi"}]


def assert_error(response: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status and error["message"]
    if param is not None:
        assert error["param"] == param, error
    return error


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"temperature": -1}, "temperature"),
        ({"temperature": "0.5"}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"n": 0}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"max_tokens": 4, "min_tokens": 5}, "min_tokens"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"top_k": -2}, "top_k"),
        ({"stop": [""]}, "stop"),
        ({"stop": 5}, "stop"),
        ({"stop_token_ids": [-1]}, "stop_token_ids[0]"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"1": 101}}, "logit_bias.1"),
        ({"frobnicate": 1}, "frobnicate"),
        ({"guided_regex": "a+"}, "guided_regex"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [[]]}, "prompt"),
        ({"prompt": None}, "prompt"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
    ],
)
async def test_completion_bad_request_is_400(
    client: httpx.AsyncClient, fake_router: FakeRouter, body: dict[str, Any], param: str | None
) -> None:
    response = await client.post("/v1/completions", json={"prompt": "x", **body})
    error = assert_error(response, 400, param)
    assert error["type"] == "invalid_request_error"
    assert fake_router.requests == []


async def test_missing_required_field_and_malformed_json(client: httpx.AsyncClient) -> None:
    assert "prompt" in assert_error(await client.post("/v1/completions", json={}), 400, "prompt")["message"]
    bad = await client.post("/v1/completions", content=b'{"prompt": ', headers={"content-type": "application/json"})
    assert "JSON" in assert_error(bad, 400)["message"]
    array = await client.post("/v1/completions", json=[1])
    assert "JSON object" in assert_error(array, 400)["message"]
    empty = await client.post("/v1/chat/completions", json={"messages": []})
    assert_error(empty, 400, "messages")
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    assert_error(await client.post("/v1/chat/completions", json={"messages": [image]}), 400)
    no_content = await client.post("/v1/chat/completions", json={"messages": [{"role": "user"}]})
    assert_error(no_content, 400, "messages[0].content")
    bad_role = await client.post("/v1/chat/completions", json={"messages": [{"role": "robot", "content": "x"}]})
    assert_error(bad_role, 400, "messages[0].role")


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"logprobs": 1}, "logprobs"),
        ("/v1/completions", {"echo": True}, "echo"),
        ("/v1/completions", {"suffix": "end"}, "suffix"),
        ("/v1/completions", {"best_of": 3}, "best_of"),
        ("/v1/completions", {"use_beam_search": True}, "use_beam_search"),
        ("/v1/chat/completions", {"logprobs": True}, "logprobs"),
        ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
        ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ("/v1/chat/completions", {"tool_choice": "auto"}, "tool_choice"),
        ("/v1/chat/completions", {"response_format": {"type": "json_object"}}, "response_format"),
        ("/v1/chat/completions", {"echo": True}, "echo"),
        (
            "/v1/chat/completions",
            {"stream": True, "stream_options": {"continuous_usage_stats": True}},
            "stream_options.continuous_usage_stats",
        ),
    ],
)
async def test_unsupported_parameters_are_refused(
    client: httpx.AsyncClient, fake_router: FakeRouter, path: str, body: dict[str, Any], param: str
) -> None:
    base = {"prompt": "x"} if path == "/v1/completions" else {"messages": CHAT}
    error = assert_error(await client.post(path, json={**base, **body}), 400, param)
    assert param in error["message"]
    assert fake_router.requests == []


@pytest.mark.parametrize(
    "body",
    [
        {"logprobs": False, "top_logprobs": None},
        {"tool_choice": "none", "tools": []},
        {"response_format": {"type": "text"}},
        {"echo": False, "user": "u", "metadata": {"a": "b"}, "store": False, "parallel_tool_calls": True},
    ],
)
async def test_harmless_values_pass(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
    response = await client.post("/v1/chat/completions", json={"messages": CHAT, **body})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("stream", [False, True])
async def test_unknown_model_is_404(client: httpx.AsyncClient, stream: bool) -> None:
    response = await client.post("/v1/completions", json={"model": "nope", "prompt": "x", "stream": stream})
    assert assert_error(response, 404)["type"] == "not_found_error"


@pytest.mark.parametrize(
    ("code", "status", "type_"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, 400, "invalid_request_error"),
        (grpc.StatusCode.FAILED_PRECONDITION, 400, "invalid_request_error"),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, 429, "rate_limit_error"),
        (grpc.StatusCode.UNAVAILABLE, 503, "service_unavailable_error"),
        (grpc.StatusCode.DEADLINE_EXCEEDED, 504, "timeout_error"),
        (grpc.StatusCode.UNIMPLEMENTED, 501, "not_implemented_error"),
        (grpc.StatusCode.INTERNAL, 500, "internal_error"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_router_status_maps_to_http(
    client: httpx.AsyncClient,
    fake_router: FakeRouter,
    code: grpc.StatusCode,
    status: int,
    type_: str,
    stream: bool,
) -> None:
    async def script(request, context):  # type: ignore[no-untyped-def]
        await context.abort(code, "the router says no")
        yield  # pragma: no cover

    fake_router.script = script
    response = await client.post("/v1/chat/completions", json={"messages": CHAT, "stream": stream})
    error = assert_error(response, status)
    assert error["type"] == type_
    assert error["message"] == "the router says no"


async def test_error_mid_stream_is_an_event_then_done(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    async def script(request, context):  # type: ignore[no-untyped-def]
        yield chunk(0, "Hel", (1,), completion=1)
        await context.abort(grpc.StatusCode.UNAVAILABLE, "engine went away")

    fake_router.script = script
    response = await client.post("/v1/completions", json={"prompt": "x", "stream": True})
    assert response.status_code == 200
    events = sse_events(response.text)
    assert events[0]["choices"][0]["text"] == "Hel"
    assert events[-1] == {
        "error": {"message": "engine went away", "type": "service_unavailable_error", "param": None, "code": 503}
    }


@pytest.mark.parametrize("stream", [False, True])
async def test_abort_is_an_error(client: httpx.AsyncClient, fake_router: FakeRouter, stream: bool) -> None:
    async def script(request, context):  # type: ignore[no-untyped-def]
        yield chunk(0, "Hel", (1,), completion=1)
        yield complete(0, abort="engine restarted")

    fake_router.script = script
    response = await client.post("/v1/chat/completions", json={"messages": CHAT, "stream": stream})
    if stream:
        events = sse_events(response.text)
        assert "engine restarted" in events[-1]["error"]["message"]
        assert events[-1]["error"]["code"] == 503
        assert all(c["choices"][0]["finish_reason"] is None for c in events[:-1])
    else:
        assert "engine restarted" in assert_error(response, 503)["message"]


async def test_unknown_route_has_openai_error_body(client: httpx.AsyncClient) -> None:
    assert_error(await client.get("/v1/nothing"), 404)
    assert_error(await client.get("/v1/completions"), 405)


async def test_unexpected_exception_is_500_without_traceback(
    client: httpx.AsyncClient, fake_router: FakeRouter, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway import openai_api

    def boom(*args: Any) -> Any:
        raise RuntimeError("secret detail")

    monkeypatch.setattr(openai_api, "chat_body", boom)
    error = assert_error(await client.post("/v1/chat/completions", json={"messages": CHAT}), 500)
    assert "secret detail" not in error["message"] and "Traceback" not in error["message"]
