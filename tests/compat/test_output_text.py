"""Text that must not differ from the peers': the stop token that ended a grammar is not text, and an
echoed token-id prompt shows its special tokens in the text as its logprob tokens do (vLLM)."""

from __future__ import annotations

from typing import Any

import openai
import pytest
from transformers import AutoTokenizer

from tests.compat.conftest import MODEL

pytestmark = [pytest.mark.e2e, pytest.mark.default_model]


@pytest.mark.parametrize(
    "constraint",
    [
        {"guided_choice": ["yes", "no"]},
        {"structured_outputs": {"regex": "(yes|no)"}},
        {"response_format": {"type": "json_object"}},
    ],
)
def test_grammar_end_is_not_text_without_skip_special_tokens(client: openai.OpenAI, constraint: dict[str, Any]) -> None:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Is the sky blue? Answer yes or no."}],
        max_tokens=30,
        temperature=0,
        extra_body={**constraint, "skip_special_tokens": False},
    )
    text = reply.choices[0].message.content or ""
    assert reply.choices[0].finish_reason == "stop"
    assert "<|im_end|>" not in text and "<|endoftext|>" not in text, text


def test_echo_of_token_ids_keeps_special_tokens_in_text_and_logprobs(
    client: openai.OpenAI, default_model_dir: Any
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(default_model_dir)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    prompt = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.convert_ids_to_tokens(prompt[0]) == "<|im_start|>"
    reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=0, echo=True, logprobs=0)
    choice = reply.choices[0]
    assert choice.logprobs is not None and choice.logprobs.tokens is not None
    assert choice.logprobs.text_offset is not None
    # The text is the tokens joined, so every offset points at its token.
    assert choice.text == "".join(choice.logprobs.tokens)
    for token, offset in zip(choice.logprobs.tokens, choice.logprobs.text_offset, strict=True):
        assert choice.text[offset : offset + len(token)] == token
    assert choice.text.startswith("<|im_start|>system\n")
