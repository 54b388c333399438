"""`stream_options.continuous_usage_stats` and chat `echo` (vLLM)."""

from __future__ import annotations

from typing import Any

import httpx

from tests.gateway.conftest import FakeRouter, sse_events

CHAT = [{"role": "user", "content": "Hi"}]
USAGE_ON = {"stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}


async def test_continuous_usage_stats_on_every_chunk(client: httpx.AsyncClient) -> None:
    for path, base in (("/v1/completions", {"prompt": "x", "n": 2}), ("/v1/chat/completions", {"messages": CHAT})):
        response = await client.post(path, json={**base, **USAGE_ON})
        assert response.status_code == 200, response.text
        events = sse_events(response.text)
        *with_choice, last = events
        assert last["choices"] == [] and last["usage"]["completion_tokens"] == (6 if "prompt" in base else 3)
        completions = []
        for event in with_choice:
            usage = event["usage"]
            assert usage is not None, event
            assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
            if event["choices"][0]["index"] == 0:
                completions.append(usage["completion_tokens"])
        # Cumulative for the choice, ending at its count.
        assert completions == sorted(completions) and completions[-1] == 3


async def test_without_continuous_usage_chunks_have_null_usage(client: httpx.AsyncClient) -> None:
    body = {"prompt": "x", "stream": True, "stream_options": {"include_usage": True}}
    events = sse_events((await client.post("/v1/completions", json=body)).text)
    assert all(e["usage"] is None for e in events[:-1]) and events[-1]["usage"] is not None
    # continuous_usage_stats alone adds nothing (as in vLLM: it refines include_usage).
    alone = {"prompt": "x", "stream": True, "stream_options": {"continuous_usage_stats": True}}
    assert all("usage" not in e for e in sse_events((await client.post("/v1/completions", json=alone)).text))


async def test_chat_echo_repeats_the_final_assistant_message(
    client: httpx.AsyncClient, fake_router: FakeRouter
) -> None:
    messages: list[dict[str, Any]] = [
        *CHAT,
        {"role": "assistant", "content": [{"type": "text", "text": "Well, "}, {"type": "text", "text": "I "}]},
    ]
    body = {"messages": messages, "echo": True, "continue_final_message": True, "add_generation_prompt": False}
    reply = (await client.post("/v1/chat/completions", json=body)).json()
    assert reply["choices"][0]["message"]["content"] == "Well, I Hello world"
    events = sse_events((await client.post("/v1/chat/completions", json={**body, "stream": True})).text)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": "", "reasoning_content": None}
    assert events[1]["choices"][0]["delta"] == {"content": "Well, I ", "reasoning_content": None}
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
    assert text == "Well, I Hello world"
    assert sum(e["choices"][0]["finish_reason"] is not None for e in events) == 1
    # The last message is the user's: nothing to echo.
    plain = (await client.post("/v1/chat/completions", json={"messages": CHAT, "echo": True})).json()
    assert plain["choices"][0]["message"]["content"] == "Hello world"
