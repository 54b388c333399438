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
        # Types (ranges are the engine's: see test_sampling).
        ({"temperature": "0.5"}, "temperature"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"top_k": 1.5}, "top_k"),
        ({"logprobs": True}, "logprobs"),
        ({"bad_words": "x"}, "bad_words"),
        ({"dry_sequence_breakers": [1]}, "dry_sequence_breakers[0]"),
        ({"stop": 5}, "stop"),
        # What the proto cannot hold.
        ({"stop_token_ids": [-1]}, "stop_token_ids[0]"),
        ({"allowed_token_ids": [2**32]}, "allowed_token_ids[0]"),
        ({"truncate_prompt_tokens": -1}, "truncate_prompt_tokens"),
        ({"prompt_logprobs": -2}, "prompt_logprobs"),
        ({"seed": 2**63}, "seed"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"-1": 1}}, "logit_bias"),
        ({"logit_bias": {"4294967296": 1}}, "logit_bias"),
        # The request's own shape.
        ({"stop": [""]}, "stop"),
        ({"stop_regex": ["a", ""]}, "stop_regex"),
        ({"guided_regex": ""}, "guided_regex"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"guided_whitespace_pattern": " *"}, "guided_whitespace_pattern"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [[]]}, "prompt"),
        ({"prompt": None}, "prompt"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"best_of": 3, "n": 2, "stream": True}, "best_of"),
        ({"best_of": 2, "stream": True}, "best_of"),
        ({"prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
        ({"prompt_logprobs": 0, "stream": True}, "prompt_logprobs"),
        ({"include_stop_str_in_output": True, "no_stop_trim": False}, "include_stop_str_in_output"),
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
    # Any role name goes to the template (vLLM's custom roles); an empty one is no role.
    bad_role = await client.post("/v1/chat/completions", json={"messages": [{"role": "", "content": "x"}]})
    assert_error(bad_role, 400, "messages[0].role")


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"suffix": "end"}, "suffix"),
        ("/v1/chat/completions", {"tool_choice": "auto"}, "tool_choice"),
        ("/v1/completions", {"image_data": "x.png"}, "image_data"),
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
    ("body", "param"),
    [
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": False, "top_logprobs": 0}, "top_logprobs"),
        ({"prompt_logprobs": 2, "stream": True}, "prompt_logprobs"),
        ({"include_stop_str_in_output": False, "no_stop_trim": True}, "include_stop_str_in_output"),
        ({"best_of": 2}, "best_of"),
        ({"logprobs": 2}, "logprobs"),
    ],
)
async def test_chat_bad_request_is_400(
    client: httpx.AsyncClient, fake_router: FakeRouter, body: dict[str, Any], param: str
) -> None:
    response = await client.post("/v1/chat/completions", json={"messages": CHAT, **body})
    assert_error(response, 400, param)
    assert fake_router.requests == []


@pytest.mark.parametrize(
    "body",
    [
        {"logprobs": False, "top_logprobs": None},
        {"logprobs": True, "top_logprobs": 0},
        {"include_stop_str_in_output": True, "no_stop_trim": True},
        {"tool_choice": "none"},
        {"response_format": {"type": "text"}},
        {"echo": False, "user": "u", "metadata": {"a": "b"}, "store": False, "parallel_tool_calls": True},
    ],
)
async def test_harmless_values_pass(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
    response = await client.post("/v1/chat/completions", json={"messages": CHAT, **body})
    assert response.status_code == 200, response.text


ENGINE_MESSAGE = "temperature must be a non-negative finite number, got -1"


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "x", "temperature": -1}),
        ("/v1/chat/completions", {"messages": CHAT, "temperature": -1}),
        ("/generate", {"text": "x", "sampling_params": {"temperature": -1}}),
    ],
)
async def test_engine_invalid_argument_reaches_the_client_verbatim(
    client: httpx.AsyncClient, fake_router: FakeRouter, path: str, body: dict[str, Any], stream: bool
) -> None:
    async def engine(request, context):  # type: ignore[no-untyped-def]
        if request.sampling_params.temperature < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, ENGINE_MESSAGE)
        yield complete(0)

    fake_router.script = engine
    error = assert_error(await client.post(path, json={**body, "stream": stream}), 400)
    assert error == {"message": ENGINE_MESSAGE, "type": "invalid_request_error", "param": None, "code": 400}
    assert fake_router.requests[0].sampling_params.temperature == -1


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
