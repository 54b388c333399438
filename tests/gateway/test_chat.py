"""`/v1/chat/completions` against the fake router."""

from __future__ import annotations

import httpx

from tests.gateway.conftest import FakeRouter, sse_events

CHAT = [{"role": "user", "content": "Hi"}]


async def test_chat_shape_and_messages(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]},
        {"role": "user", "content": "Hi", "name": "ann"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "content": "42", "tool_call_id": "c1"},
    ]
    response = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": messages})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"].startswith("chatcmpl-")
    assert body["object"] == "chat.completion"
    assert body["model"] == "tiny"
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello world", "reasoning_content": None},
            "logprobs": None,
            "finish_reason": "stop",
            "stop_reason": 2,
            # SGLang's matched_stop: what stop_reason says, the EOS id too.
            "matched_stop": 2,
            # vLLM's return_token_ids: null unless asked for.
            "token_ids": None,
        }
    ]
    # vLLM's prompt_logprobs and prompt_token_ids are always there, null unless asked for.
    assert body["prompt_logprobs"] is None and body["prompt_token_ids"] is None
    assert body["usage"]["total_tokens"] == 8
    [sent] = fake_router.requests
    chat = sent.chat
    assert [m.role for m in chat.messages] == ["system", "developer", "user", "assistant", "tool"]
    assert chat.messages[0].content == "Be brief."
    assert not chat.messages[1].HasField("content")
    assert [(p.type, p.text) for p in chat.messages[1].content_parts] == [("text", "A"), ("text", "B")]
    assert chat.messages[2].name == "ann"
    assert chat.messages[3].tool_calls[0].name == "f" and not chat.messages[3].HasField("content")
    assert chat.messages[4].tool_call_id == "c1"
    # Chat leaves max tokens to the engine (what is left of the context), and the template defaults alone.
    assert not sent.sampling_params.HasField("max_new_tokens")
    assert not sent.chat.options.HasField("add_generation_prompt")
    assert not sent.chat.options.HasField("continue_final_message")


async def test_max_completion_tokens_wins(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    payload = {"messages": CHAT, "max_tokens": 5, "max_completion_tokens": 9}
    assert (await client.post("/v1/chat/completions", json=payload)).status_code == 200
    assert fake_router.requests[0].sampling_params.max_new_tokens == 9
    assert (await client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 5})).status_code == 200
    assert fake_router.requests[1].sampling_params.max_new_tokens == 5


async def test_template_options(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    payload = {
        "messages": CHAT,
        "add_generation_prompt": False,
        "chat_template": "{{ messages }}",
        "chat_template_kwargs": {"enable_thinking": False},
        "documents": [{"title": "t", "text": "x"}],
    }
    assert (await client.post("/v1/chat/completions", json=payload)).status_code == 200
    options = fake_router.requests[0].chat.options
    assert options.HasField("add_generation_prompt") and not options.add_generation_prompt
    assert options.chat_template == "{{ messages }}"
    assert dict(options.chat_template_kwargs) == {"enable_thinking": False}
    assert dict(options.documents[0]) == {"title": "t", "text": "x"}


async def test_continue_final_message(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    messages = [*CHAT, {"role": "assistant", "content": "Hel"}]
    ok = await client.post("/v1/chat/completions", json={"messages": messages, "continue_final_message": True})
    assert ok.status_code == 200
    options = fake_router.requests[0].chat.options
    assert options.continue_final_message and not options.add_generation_prompt
    both = {"messages": messages, "continue_final_message": True, "add_generation_prompt": True}
    response = await client.post("/v1/chat/completions", json=both)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "continue_final_message"


async def test_chat_stream_role_first_and_one_finish_per_choice(
    client: httpx.AsyncClient, fake_router: FakeRouter
) -> None:
    payload = {"messages": CHAT, "n": 2, "stream": True, "stream_options": {"include_usage": True}}
    response = await client.post("/v1/chat/completions", json=payload)
    assert response.status_code == 200
    *chunks, last = sse_events(response.text)
    assert last["choices"] == [] and last["usage"]["prompt_tokens"] == 5 and last["usage"]["completion_tokens"] == 6
    assert all(c["object"] == "chat.completion.chunk" and c["usage"] is None for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert mine[0]["delta"] == {"role": "assistant", "content": "", "reasoning_content": None}
        assert all("role" not in c["delta"] for c in mine[1:])
        assert "".join(c["delta"].get("content", "") for c in mine) == "Hello world"
        assert [c["finish_reason"] for c in mine if c["finish_reason"]] == ["stop"]
        assert mine[-1]["finish_reason"] == "stop"


async def test_request_id_is_used(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    response = await client.post("/v1/chat/completions", json={"messages": CHAT, "request_id": "abc"})
    assert response.json()["id"] == "chatcmpl-abc"
    # The id itself goes to the router (logs and traces match it); the response id adds the prefix.
    assert fake_router.requests[0].request_id == "abc"


async def test_echoed_assistant_message_is_accepted(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    previous: dict[str, object] = {
        "role": "assistant",
        "content": "Hello",
        "refusal": None,
        "annotations": [],
        "tool_calls": None,
    }
    payload = {"messages": [*CHAT, previous, {"role": "user", "content": "again"}]}
    assert (await client.post("/v1/chat/completions", json=payload)).status_code == 200
