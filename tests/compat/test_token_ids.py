"""vLLM's `return_token_ids` (tests/entrypoints/openai/test_return_token_ids.py): the prompt's ids and
each choice's ids in bodies, and in stream chunks where vLLM puts them."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from tests.compat.conftest import MODEL

pytestmark = [pytest.mark.e2e, pytest.mark.default_model]

PROMPT = "Hello, world! How are you today?"
CHAT = [
    {"role": "system", "content": "You like to use emojis in your responses."},
    {"role": "user", "content": "Repeat after me: I love cats 🐱"},
]


@pytest.fixture(scope="module")
def tokenizer(default_model_dir: Any) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(default_model_dir)


def test_completion_body_has_prompt_and_choice_token_ids(
    client: openai.OpenAI, tokenizer: PreTrainedTokenizerBase
) -> None:
    reply = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0, logprobs=1, extra_body={"return_token_ids": True}
    )
    choice = reply.choices[0].model_dump()
    assert tokenizer.decode(choice["prompt_token_ids"]) == PROMPT
    assert 0 < len(choice["token_ids"]) <= 10
    assert tokenizer.decode(choice["token_ids"], skip_special_tokens=True) == choice["text"]
    # The sampled tokens' logprobs are those same tokens.
    assert reply.choices[0].logprobs is not None
    assert [tokenizer.decode([t]) for t in choice["token_ids"]] == reply.choices[0].logprobs.tokens
    without = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0)
    assert without.choices[0].model_dump().get("token_ids") is None
    assert without.choices[0].model_dump().get("prompt_token_ids") is None


def test_completion_stream_token_ids_match_the_body(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": MODEL, "prompt": PROMPT, "max_tokens": 12, "temperature": 0}
    kwargs["extra_body"] = {"return_token_ids": True}
    whole = client.completions.create(**kwargs).choices[0].model_dump()
    chunks = [c.choices[0].model_dump() for c in client.completions.create(stream=True, **kwargs)]
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    assert all(c.get("prompt_token_ids") is None for c in chunks[1:])
    assert [t for c in chunks for t in c["token_ids"]] == whole["token_ids"]


def test_chat_body_and_stream(client: openai.OpenAI, tokenizer: PreTrainedTokenizerBase) -> None:
    kwargs: dict[str, Any] = {"model": MODEL, "messages": CHAT, "max_tokens": 20, "temperature": 0}
    kwargs["extra_body"] = {"return_token_ids": True}
    reply = client.chat.completions.create(**kwargs)
    body = reply.model_dump()
    prompt = tokenizer.decode(body["prompt_token_ids"])
    assert "You like to use emojis in your responses." in prompt and "I love cats 🐱" in prompt
    token_ids = body["choices"][0]["token_ids"]
    assert tokenizer.decode(token_ids, skip_special_tokens=True) == reply.choices[0].message.content

    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    assert chunks[0].model_dump()["prompt_token_ids"] == body["prompt_token_ids"]
    assert all("prompt_token_ids" not in (c.model_extra or {}) for c in chunks[1:])
    streamed = [t for c in chunks if c.choices for t in (c.choices[0].model_dump().get("token_ids") or [])]
    assert streamed == token_ids

    without = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=3).model_dump()
    assert without["prompt_token_ids"] is None and without["choices"][0]["token_ids"] is None
