"""`/v1/completions` and `/v1/models` against the fake router."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.gateway.conftest import FakeRouter, chunk, complete, default_script, sse_events


async def test_models_list_shape(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    response = await client.get("/v1/models")
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    [card] = body["data"]
    assert card["id"] == "tiny"
    assert card["object"] == "model"
    assert card["owned_by"] == "turnout"
    assert card["max_model_len"] == 2048
    assert isinstance(card["created"], int)


async def test_models_created_is_the_listings_time(
    client: httpx.AsyncClient, fake_router: FakeRouter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As vLLM and SGLang: not a time of the gateway process's own, which several gateways
    # (--api-server-count) would each report differently.
    import gateway.openai_api

    monkeypatch.setattr(gateway.openai_api.time, "time", lambda: 1_900_000_000.5)
    [card] = (await client.get("/v1/models")).json()["data"]
    assert card["created"] == 1_900_000_000


async def test_model_by_id_with_slash_and_unknown(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    fake_router.models[0].name = "org/tiny"
    found = await client.get("/v1/models/org/tiny")
    assert found.status_code == 200
    assert found.json()["id"] == "org/tiny"
    missing = await client.get("/v1/models/nope")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == 404
    assert missing.json()["error"]["type"] == "not_found_error"


async def test_completion_shape_and_defaults(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    response = await client.post("/v1/completions", json={"model": "tiny", "prompt": "Say hi"})
    assert response.status_code == 200
    body = response.json()
    assert body["id"].startswith("cmpl-")
    assert body["object"] == "text_completion"
    assert body["model"] == "tiny"
    assert isinstance(body["created"], int)
    assert "system_fingerprint" in body
    assert body["choices"] == [
        {
            "index": 0,
            "text": "Hello world",
            "logprobs": None,
            "finish_reason": "stop",
            "stop_reason": 2,
            # SGLang's matched_stop; vLLM's prompt_logprobs, null unless asked for.
            "matched_stop": 2,
            "prompt_logprobs": None,
            # vLLM's return_token_ids: null unless asked for.
            "prompt_token_ids": None,
            "token_ids": None,
        }
    ]
    assert body["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 3,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 1},
    }
    [sent] = fake_router.requests
    assert sent.text == "Say hi"
    assert sent.model == "tiny"
    assert body["id"] == f"cmpl-{sent.request_id}"
    # OpenAI's default for completions, and nothing else set.
    assert sent.sampling_params.max_new_tokens == 16
    assert [field.name for field, _ in sent.sampling_params.ListFields()] == ["max_new_tokens"]
    assert not sent.HasField("logprob_options")
    assert not sent.HasField("add_special_tokens") and not sent.HasField("priority")


async def test_explicit_null_max_tokens_leaves_it_unset(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    response = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": None})
    assert response.status_code == 200
    assert not fake_router.requests[0].sampling_params.HasField("max_new_tokens")


async def test_missing_model_uses_default_name(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    response = await client.post("/v1/completions", json={"prompt": "x"})
    assert response.json()["model"] == "tiny"
    assert fake_router.requests[0].model == ""
    assert fake_router.model_requests == [""]


async def test_sampling_parameters_are_mapped(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    payload = {
        "prompt": "x",
        "max_tokens": 7,
        "min_tokens": 2,
        "temperature": 0,
        "top_p": 0.5,
        "top_k": -1,
        "min_p": 0.1,
        "frequency_penalty": 0.5,
        "presence_penalty": -0.5,
        "repetition_penalty": 1.2,
        "stop": "END",
        "stop_token_ids": [7, 9],
        "ignore_eos": True,
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "include_stop_str_in_output": True,
        "n": 1,
        "seed": -3,
        "logit_bias": {"50256": -100, "7": 2.5},
        "add_special_tokens": False,
        "priority": 4,
        "user": "someone",
        "metadata": {"k": "v"},
    }
    assert (await client.post("/v1/completions", json=payload)).status_code == 200
    [sent] = fake_router.requests
    sp = sent.sampling_params
    assert (sp.max_new_tokens, sp.min_new_tokens, sp.temperature, sp.top_k, sp.n, sp.seed) == (7, 2, 0.0, -1, 1, -3)
    assert sp.top_p == 0.5 and abs(sp.min_p - 0.1) < 1e-6 and abs(sp.repetition_penalty - 1.2) < 1e-6
    assert (sp.frequency_penalty, sp.presence_penalty) == (0.5, -0.5)
    assert list(sp.stop) == ["END"] and list(sp.stop_token_ids) == [7, 9]
    assert sp.ignore_eos and sp.no_stop_trim
    assert sp.HasField("skip_special_tokens") and not sp.skip_special_tokens
    assert sp.HasField("spaces_between_special_tokens") and not sp.spaces_between_special_tokens
    assert dict(sp.logit_bias) == {50256: -100.0, 7: 2.5}
    assert sent.HasField("add_special_tokens") and not sent.add_special_tokens
    assert sent.priority == 4


async def test_batch_prompts_with_n(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    response = await client.post("/v1/completions", json={"prompt": ["a", "b"], "n": 2})
    assert response.status_code == 200
    body = response.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert sorted(r.text for r in fake_router.requests) == ["a", "b"]
    assert len({r.request_id for r in fake_router.requests}) == 2
    # Two prompts of 5 tokens (each counted once), four samples of 3 tokens.
    assert body["usage"]["prompt_tokens"] == 10
    assert body["usage"]["completion_tokens"] == 12
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 2


async def test_token_id_prompts(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    assert (await client.post("/v1/completions", json={"prompt": [1, 2, 3]})).status_code == 200
    assert list(fake_router.requests[0].input_ids.ids) == [1, 2, 3]
    response = await client.post("/v1/completions", json={"prompt": [[4], [5, 6]]})
    assert len(response.json()["choices"]) == 2
    assert sorted(list(r.input_ids.ids) for r in fake_router.requests[1:]) == [[4], [5, 6]]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize(
    ("reason", "finish_reason", "stop_reason"),
    [
        ({"token_id": 7}, "stop", 7),
        ({"eos_token_id": 2}, "stop", None),
        ({"stop_str": "END"}, "stop", "END"),
        ({"regex": "x+"}, "stop", "x+"),
        ({}, "stop", None),
        ({"length": 16}, "length", None),
    ],
)
async def test_finish_and_stop_reason(
    client: httpx.AsyncClient,
    fake_router: FakeRouter,
    reason: dict[str, Any],
    finish_reason: str,
    stop_reason: int | str | None,
    path: str,
    stream: bool,
) -> None:
    async def script(request, context):  # type: ignore[no-untyped-def]
        yield chunk(0, "x", (5,), completion=1)
        yield complete(0, **reason)

    fake_router.script = script
    body = {"prompt": "x"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "x"}]}
    response = await client.post(path, json={**body, "stream": stream})
    choices = [e["choices"][0] for e in sse_events(response.text)] if stream else response.json()["choices"]
    last = choices[-1]
    assert (last["finish_reason"], last["stop_reason"]) == (finish_reason, stop_reason)
    assert "stop_reason" in last


async def test_best_of_is_forwarded_and_n_choices_rendered(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    response = await client.post("/v1/completions", json={"prompt": "x", "n": 2, "best_of": 3})
    assert [c["index"] for c in response.json()["choices"]] == [0, 1]
    sp = fake_router.requests[0].sampling_params
    assert (sp.n, sp.best_of) == (2, 3)
    streamed = await client.post("/v1/completions", json={"prompt": "x", "n": 2, "best_of": 2, "stream": True})
    assert streamed.status_code == 200
    assert fake_router.requests[1].sampling_params.best_of == 2


async def test_beam_search_fields_are_forwarded(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    body = {"prompt": "x", "n": 2, "best_of": 4, "use_beam_search": True, "length_penalty": 0.5}
    response = await client.post("/v1/completions", json={**body, "early_stopping": True})
    assert [c["index"] for c in response.json()["choices"]] == [0, 1]
    sp = fake_router.requests[0].sampling_params
    assert (sp.use_beam_search, sp.best_of, sp.length_penalty, sp.early_stopping) == (True, 4, 0.5, "true")
    # Streamed too (the choices arrive whole when the search ends), best_of > n notwithstanding.
    streamed = await client.post("/v1/completions", json={**body, "stream": True, "early_stopping": "never"})
    assert streamed.status_code == 200
    assert fake_router.requests[1].sampling_params.early_stopping == "never"
    chat = {"messages": [{"role": "user", "content": "x"}], "use_beam_search": True, "early_stopping": False}
    assert (await client.post("/v1/chat/completions", json=chat)).status_code == 200
    assert fake_router.requests[2].sampling_params.early_stopping == "false"
    plain = await client.post("/v1/completions", json={"prompt": "x"})
    assert plain.status_code == 200
    assert not fake_router.requests[3].sampling_params.HasField("use_beam_search")


async def test_stream_framing_single_finish_and_usage(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    payload = {"prompt": "x", "n": 2, "stream": True, "stream_options": {"include_usage": True}}
    response = await client.post("/v1/completions", json=payload)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    *chunks, last = events
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 6
    for event in chunks:
        assert event["object"] == "text_completion"
        assert event["usage"] is None
        assert len(event["choices"]) == 1
    for index in (0, 1):
        mine = [e["choices"][0] for e in chunks if e["choices"][0]["index"] == index]
        assert "".join(c["text"] for c in mine) == "Hello world"
        assert [c["finish_reason"] for c in mine if c["finish_reason"] is not None] == ["stop"]
        # The held-back empty text chunk is not sent.
        assert all(c["text"] or c["finish_reason"] for c in mine)


async def test_stream_without_usage_has_no_usage_field(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    response = await client.post("/v1/completions", json={"prompt": "x", "stream": True})
    events = sse_events(response.text)
    assert all("usage" not in e for e in events)
    assert all(e["choices"] for e in events)


async def _last_chunk_marked(request: Any, context: Any) -> Any:
    """The router's way: the last chunk of a sample says so, and its Complete follows."""
    yield chunk(0, "Hello", (11, 12), completion=2)
    last = chunk(0, " world", (13,), completion=3)
    last.chunk.last = True
    yield last
    yield complete(0, length=3)


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
async def test_finish_reason_rides_on_the_last_chunk(
    client: httpx.AsyncClient, fake_router: FakeRouter, route: str
) -> None:
    fake_router.script = _last_chunk_marked
    body = {"prompt": "Say hi"} if route == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}]}
    events = sse_events((await client.post(route, json={**body, "stream": True})).text)
    choices = [e["choices"][0] for e in events]
    if route == "/v1/chat/completions":
        choices = choices[1:]  # the role delta
    texts = [c["text"] if "text" in c else c["delta"]["content"] for c in choices]
    assert texts == ["Hello", " world"]
    assert [c["finish_reason"] for c in choices] == [None, "length"]
    # Without the mark, the end comes in a chunk of its own (a sample ended without a last token).
    fake_router.script = default_script
    events = sse_events((await client.post(route, json={**body, "stream": True})).text)
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    assert events[-1]["choices"][0].get("text", "") == "" and events[-2]["choices"][0]["finish_reason"] is None


async def test_a_router_stream_without_responses_is_a_502(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    async def nothing(request: Any, context: Any) -> Any:
        return
        yield

    fake_router.script = nothing
    reply = await client.post("/v1/completions", json={"prompt": "Say hi", "return_token_ids": True})
    assert reply.status_code == 502 and "before samples [0] finished" in reply.json()["error"]["message"]
