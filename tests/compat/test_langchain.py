"""LangChain's `ChatOpenAI`, unmodified, against a live stack: chat completions and, with
`use_responses_api=True`, the Responses API, each invoked and streamed, equal to our greedy chat reply."""

from __future__ import annotations

import openai
import pytest
from langchain_openai import ChatOpenAI

from tests.compat.conftest import MODEL
from tests.e2e.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.default_model]

QUESTION = "Name three colours."


def _model(stack: Stack, **extra: object) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=f"{stack.base_url}/v1", api_key="unused", model=MODEL, temperature=0, max_tokens=20, **extra
    )


def _expected(client: openai.OpenAI) -> str:
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], max_tokens=20, temperature=0
    )
    text = reply.choices[0].message.content
    assert text
    return text


@pytest.mark.parametrize("responses", [False, True], ids=["chat", "responses"])
def test_chat_openai_invoke_and_stream(compat_stack: Stack, client: openai.OpenAI, responses: bool) -> None:
    expected = _expected(client)
    model = _model(compat_stack, use_responses_api=responses)
    reply = model.invoke(QUESTION)
    assert reply.text == expected
    assert reply.usage_metadata is not None and reply.usage_metadata["output_tokens"] > 0
    streamed = "".join(chunk.text for chunk in model.stream(QUESTION))
    assert streamed == expected
