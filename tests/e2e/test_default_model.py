"""The default pretrained model answers sensibly through the whole stack (the README example)."""

from __future__ import annotations

import openai
import pytest

from tests.e2e.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.default_model]


def test_readme_chat_example_answers_paris(default_stack: Stack) -> None:
    client = openai.OpenAI(base_url=f"{default_stack.base_url}/v1", api_key="unused", max_retries=0)
    reply = client.chat.completions.create(
        model="SmolLM2-135M-Instruct",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0,
    )
    assert reply.choices[0].message.content == "The capital of France is Paris."
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None and reply.usage.prompt_tokens == 37


def test_stop_string_that_the_model_really_says(default_stack: Stack) -> None:
    client = openai.OpenAI(base_url=f"{default_stack.base_url}/v1", api_key="unused", max_retries=0)
    chunks = list(
        client.chat.completions.create(
            model="SmolLM2-135M-Instruct",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            temperature=0,
            stop=["Paris"],
            stream=True,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "The capital of France is "
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
