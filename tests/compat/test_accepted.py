"""Requests vLLM and SGLang answer with 200 that Turnout refused: custom chat roles, "true" strings for
chat `logprobs`, `custom_params` lists, tools whose parameters use local `$defs`; and `-1` logprobs,
which are the whole vocabulary bounded by `--max-logprobs` (400 naming it when the vocabulary is larger)."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from tests.compat.conftest import MODEL
from tests.e2e.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.default_model]


def test_custom_chat_role_goes_to_the_template(client: openai.OpenAI, default_model_dir: Any) -> None:
    messages: Any = [{"role": "narrator", "content": "It was a dark night."}, {"role": "user", "content": "Go on."}]
    reply = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=3, extra_body={"return_token_ids": True}
    )
    prompt = AutoTokenizer.from_pretrained(default_model_dir).decode(reply.model_dump()["prompt_token_ids"])
    assert "<|im_start|>narrator\nIt was a dark night." in prompt


def test_chat_logprobs_as_a_string(compat_stack: Stack) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
    reply = httpx.post(f"{compat_stack.base_url}/v1/chat/completions", json={**body, "logprobs": "true"}, timeout=300)
    assert reply.status_code == 200, reply.text
    assert len(reply.json()["choices"][0]["logprobs"]["content"]) == 3


@pytest.mark.parametrize(
    ("route", "extra", "field"),
    [
        ("/v1/completions", {"prompt": "Hi", "logprobs": -1}, "top_logprobs_num"),
        ("/v1/completions", {"prompt": "Hi", "prompt_logprobs": -1}, "prompt_logprobs"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hi"}], "logprobs": True, "top_logprobs": -1},
            "top_logprobs_num",
        ),
    ],
)
def test_minus_one_logprobs_is_the_vocabulary_bounded_by_max_logprobs(
    compat_stack: Stack, route: str, extra: dict[str, Any], field: str
) -> None:
    reply = httpx.post(f"{compat_stack.base_url}{route}", json={"model": MODEL, "max_tokens": 2, **extra}, timeout=300)
    # The vocabulary (49152) is more than the default --max-logprobs (20): refused naming the limit.
    assert reply.status_code == 400, reply.text
    message = reply.json()["error"]["message"]
    assert field in message and "whole vocabulary (49152 tokens)" in message and "--max-logprobs (20)" in message


def test_custom_params_list_is_one_per_prompt(compat_stack: Stack, default_model_dir: Any) -> None:
    tokenizer = AutoTokenizer.from_pretrained(default_model_dir)
    first, second = tokenizer.encode(" cat")[0], tokenizer.encode(" dog")[0]
    body = {
        "text": ["Once", "Twice"],
        "custom_logit_processor": "deterministic_token",
        "sampling_params": {"max_new_tokens": 3, "custom_params": [{"token_id": first}, {"token_id": second}]},
    }
    outputs = httpx.post(f"{compat_stack.base_url}/generate", json=body, timeout=300).json()
    assert [o["output_ids"] for o in outputs] == [[first] * 3, [second] * 3]
    short = {**body, "sampling_params": {"max_new_tokens": 3, "custom_params": [{"token_id": first}]}}
    refused = httpx.post(f"{compat_stack.base_url}/generate", json=short, timeout=300)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "sampling_params.custom_params"


def test_required_tool_choice_with_local_defs(client: openai.OpenAI) -> None:
    tools: Any = [
        {
            "type": "function",
            "function": {
                "name": "add_person",
                "description": "Add a person to the address book",
                "parameters": {
                    "type": "object",
                    "$defs": {
                        "Address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
                    },
                    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/Address"}},
                    "required": ["name", "address"],
                },
            },
        }
    ]
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Add Ann, who lives in Paris."}],
        tools=tools,
        tool_choice="required",
        max_tokens=60,
        temperature=0,
    )
    calls = reply.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "add_person"
