"""Stream chunk rules of vLLM (tests/entrypoints/openai/test_completion.py, test_chat.py) and SGLang
(test/srt/openai_server/): the finish reason rides on the last token's chunk, one chunk per token."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.compat.conftest import MODEL
from tests.e2e.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.default_model]

PROMPT = "The history of the Roman Empire"
CHAT = [{"role": "user", "content": "Tell me about the Roman Empire."}]


def _sse(response: httpx.Response) -> list[dict[str, Any]]:
    lines = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_completion_stream_finish_rides_on_the_last_token(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": MODEL, "prompt": PROMPT, "max_tokens": 20, "temperature": 0}
    kwargs["extra_body"] = {"ignore_eos": True}
    whole = client.completions.create(**kwargs).choices[0].text
    chunks = list(client.completions.create(stream=True, **kwargs))
    # One chunk per token: 20, not 20 and a trailing finish-only chunk.
    assert len(chunks) == 20
    assert [c.choices[0].finish_reason for c in chunks] == [None] * 19 + ["length"]
    assert chunks[-1].choices[0].text
    assert "".join(c.choices[0].text for c in chunks) == whole


def test_completion_stream_with_logprobs_has_them_on_the_last_chunk(client: openai.OpenAI) -> None:
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=PROMPT,
            max_tokens=5,
            temperature=0,
            logprobs=2,
            stream=True,
            extra_body={"ignore_eos": True},
        )
    )
    assert len(chunks) == 5
    last = chunks[-1].choices[0]
    assert last.finish_reason == "length" and last.logprobs is not None and len(last.logprobs.tokens) == 1


def test_chat_stream_finish_rides_on_the_last_token(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": MODEL, "messages": CHAT, "max_tokens": 20, "temperature": 0}
    kwargs["extra_body"] = {"ignore_eos": True}
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    # The role chunk, then one chunk per token, the last one with the finish reason.
    assert chunks[0].choices[0].delta.role == "assistant"
    content = chunks[1:]
    assert len(content) == 20
    assert [c.choices[0].finish_reason for c in content] == [None] * 19 + ["length"]
    assert content[-1].choices[0].delta.content
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole


def test_chat_stream_eos_token_chunk_carries_the_finish(client: openai.OpenAI) -> None:
    """The model stops on its own: the EOS token's chunk (no text) carries finish_reason "stop"."""
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Say hi."}], max_tokens=200, temperature=0, stream=True
        )
    )
    finishes = [c.choices[0].finish_reason for c in chunks]
    assert finishes.count("stop") == 1 and finishes[-1] == "stop"


def test_stop_string_that_consumes_the_text_ends_with_an_empty_chunk(client: openai.OpenAI) -> None:
    """As in vLLM: the token that completed the stop string has its chunk, with no text and the finish."""
    kwargs: dict[str, Any] = {"model": MODEL, "prompt": PROMPT, "max_tokens": 30, "temperature": 0}
    whole = client.completions.create(**kwargs).choices[0].text
    stop = whole.split()[3]
    chunks = list(client.completions.create(stream=True, stop=[stop], **kwargs))
    finishes = [c.choices[0].finish_reason for c in chunks]
    assert finishes == [None] * (len(chunks) - 1) + ["stop"]
    assert chunks[-1].choices[0].model_extra is not None and chunks[-1].choices[0].model_extra["stop_reason"] == stop
    assert "".join(c.choices[0].text for c in chunks) == whole[: whole.index(stop)]


def test_every_chat_delta_has_the_reasoning_content_key(compat_stack: Stack) -> None:
    """SGLang clients read delta["reasoning_content"]; it is there (null) without reasoning too."""
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 5, "stream": True}
    response = httpx.post(f"{compat_stack.base_url}/v1/chat/completions", json=body, timeout=300)
    chunks = _sse(response)
    assert chunks and all(c["choices"][0]["delta"]["reasoning_content"] is None for c in chunks)


def test_native_generate_stream_ends_with_the_last_token(compat_stack: Stack) -> None:
    """SGLang's /generate stream: cumulative outputs, one per token, the last with the finish reason."""
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}}
    whole = httpx.post(f"{compat_stack.base_url}/generate", json=body, timeout=300).json()
    events = _sse(httpx.post(f"{compat_stack.base_url}/generate", json={**body, "stream": True}, timeout=300))
    assert len(events) == 8
    assert [len(e["output_ids"]) for e in events] == list(range(1, 9))
    assert [e["meta_info"]["finish_reason"] for e in events[:-1]] == [None] * 7
    assert events[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 8}
    assert events[-1]["text"] == whole["text"]
