"""vLLM's beam search over `/v1/completions` and chat (tests/entrypoints/openai/test_completion.py's
beam-search cases): `use_beam_search` with best_of beams returns the n best, ordered by score, the same
streamed or not; invalid combinations are 400s with vLLM's messages."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.compat.conftest import MODEL
from tests.e2e.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.default_model]

PROMPT = "The capital of France is"
BEAMS = {"use_beam_search": True, "best_of": 4}


def test_completion_returns_n_best_beams_by_score(client: openai.OpenAI) -> None:
    reply = client.completions.create(model=MODEL, prompt=PROMPT, n=2, max_tokens=8, logprobs=0, extra_body=BEAMS)
    assert [c.index for c in reply.choices] == [0, 1]
    texts = [c.text for c in reply.choices]
    assert texts[0] != texts[1]
    scores = []
    for choice in reply.choices:
        assert choice.logprobs is not None and choice.logprobs.token_logprobs
        logprobs = choice.logprobs.token_logprobs
        scores.append(sum(logprobs) / len(logprobs))  # length_penalty 1.0
        assert choice.finish_reason in ("stop", "length")
    assert scores[0] >= scores[1]
    # Deterministic (greedy), and streaming gives the same choices, whole, at the end.
    again = client.completions.create(model=MODEL, prompt=PROMPT, n=2, max_tokens=8, extra_body=BEAMS)
    assert [c.text for c in again.choices] == texts
    stream = client.completions.create(model=MODEL, prompt=PROMPT, n=2, max_tokens=8, stream=True, extra_body=BEAMS)
    streamed = ["", ""]
    for chunk in stream:
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
    assert streamed == texts


def test_chat_beam_search_width_is_n(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    reply = client.chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        n=3,
        max_tokens=12,
        extra_body={"use_beam_search": True, "length_penalty": 0.5, "early_stopping": True},
    )
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert len({c.message.content for c in reply.choices}) == 3


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"temperature": 0.7}, "temperature must be 0 when using beam search"),
        ({"top_p": 0.5}, "top_p must be 1 when using beam search"),
        ({"top_k": 5}, "top_k must be -1 when using beam search"),
        ({"n": 5}, "best_of must be at least n (5), got 4"),
        ({"early_stopping": "sometimes"}, "early_stopping must be True, False, or 'never'"),
        ({"stop": ["."]}, "stop cannot be used with beam search"),
        ({"guided_regex": "a+"}, "regex (structured output) cannot be used with beam search"),
        ({"use_beam_search": False, "length_penalty": 0.5}, "length_penalty is not effective"),
        ({"use_beam_search": False, "early_stopping": True}, "early_stopping is not effective"),
    ],
)
def test_invalid_combinations_are_400s(compat_stack: Stack, extra: dict[str, Any], message: str) -> None:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4, **BEAMS, **extra}
    reply = httpx.post(f"{compat_stack.base_url}/v1/completions", json=body, timeout=300)
    assert reply.status_code == 400, reply.text
    assert message in reply.json()["error"]["message"]
