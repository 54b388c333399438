"""Tool calling, reasoning separation, the thinking budget and custom logit processors through
all four real services and the official `openai` client."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import pytest
from openai import BadRequestError, OpenAI

from tests.e2e.stack import Stack
from turnout.custom_logit_processor import CustomLogitProcessor

pytestmark = pytest.mark.e2e

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 20}}, "required": ["zone"]}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "Time now", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'


def openai_client(stack: Stack) -> OpenAI:
    return OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", timeout=120, max_retries=0)


def streamed_calls(stream: Any) -> tuple[dict[int, dict[str, str]], list[str | None], str]:
    """Tool calls assembled from stream deltas by index, the finish reasons, and the content."""
    calls: dict[int, dict[str, str]] = {}
    finishes = []
    content = ""
    for chunk in stream:
        choice = chunk.choices[0]
        finishes.append(choice.finish_reason)
        content += choice.delta.content or ""
        for delta in choice.delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            if delta.id:
                assert not call["id"], "the id comes with a call's first delta only"
                call["id"] = delta.id
            if delta.function and delta.function.name:
                call["name"] += delta.function.name
            if delta.function and delta.function.arguments:
                call["arguments"] += delta.function.arguments
    return calls, [f for f in finishes if f], content


@pytest.mark.default_model
def test_named_tool_choice_validates_streamed_and_not(default_stack: Stack) -> None:
    client = openai_client(default_stack)
    choice = {"type": "function", "function": {"name": "get_weather"}}
    kwargs: dict[str, Any] = {"model": "", "messages": ASK, "tools": TOOLS, "tool_choice": choice, "max_tokens": 64}
    whole = client.chat.completions.create(**kwargs, temperature=0)
    (call,) = whole.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather" and call.id.startswith("call_")  # type: ignore[union-attr]
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)  # type: ignore[union-attr]
    assert whole.choices[0].finish_reason == "stop"

    calls, finishes, content = streamed_calls(client.chat.completions.create(**kwargs, temperature=0, stream=True))
    assert list(calls) == [0] and calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["arguments"]) == json.loads(call.function.arguments)  # type: ignore[union-attr]
    assert finishes == ["stop"] and content == ""


@pytest.mark.default_model
def test_required_tool_choice_gives_valid_calls(default_stack: Stack) -> None:
    client = openai_client(default_stack)
    for seed, parallel in ((0, False), (1, True), (2, True)):
        reply = client.chat.completions.create(
            model="",
            messages=ASK,
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=parallel,
            max_tokens=160,
            temperature=0.8,
            seed=seed,
        )
        calls = reply.choices[0].message.tool_calls or []
        assert calls and (parallel or len(calls) == 1), reply
        assert len({c.id for c in calls}) == len(calls)
        for call in calls:
            jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])  # type: ignore[union-attr]
        assert reply.choices[0].finish_reason == "tool_calls"


@pytest.mark.default_model
def test_auto_tool_choice_parses_the_models_format(default_stack: Stack) -> None:
    """The default model does not write Hermes calls by itself; a regex makes it, and the parser
    must read them out of the text, whole and streamed."""
    client = openai_client(default_stack)
    regex = "Sure\\. " + HERMES_CALL.replace("{", "\\{").replace("}", "\\}")
    kwargs: dict[str, Any] = {"model": "", "messages": ASK, "tools": TOOLS, "max_tokens": 96}
    whole = client.chat.completions.create(**kwargs, extra_body={"guided_regex": regex})
    message = whole.choices[0].message
    (call,) = message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "celsius"}  # type: ignore[union-attr]
    assert message.content == "Sure. " and whole.choices[0].finish_reason == "tool_calls"

    stream = client.chat.completions.create(**kwargs, stream=True, extra_body={"guided_regex": regex})
    calls, finishes, content = streamed_calls(stream)
    assert [c["name"] for c in calls.values()] == ["get_weather"]
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris", "unit": "celsius"}
    assert content == "Sure. " and finishes == ["tool_calls"]


@pytest.mark.default_model
def test_tool_messages_round_trip_through_the_template(default_stack: Stack) -> None:
    client = openai_client(default_stack)
    arguments = json.dumps({"city": "Paris", "unit": "celsius"})
    messages: list[Any] = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'},
    ]
    reply = client.chat.completions.create(model="", messages=messages, tools=TOOLS, max_tokens=8, temperature=0)
    assert reply.choices[0].finish_reason in ("stop", "length", "tool_calls")
    tokens = httpx.post(f"{default_stack.base_url}/tokenize", json={"messages": messages, "tools": TOOLS}, timeout=30)
    assert tokens.status_code == 200, tokens.text


def test_auto_without_a_parser_is_400(tiny_stack: Stack) -> None:
    with pytest.raises(BadRequestError, match="--tool-call-parser"):
        openai_client(tiny_stack).chat.completions.create(model="", messages=ASK, tools=TOOLS, max_tokens=4)


def _thinking_reply(stack: Stack, budget: int, **extra: Any) -> dict[str, Any]:
    body = {
        "messages": [{"role": "user", "content": "think"}],
        "max_tokens": budget + 12,
        "min_tokens": budget + 12,
        "temperature": 0,
        "thinking_budget": budget,
        "logprobs": True,
        "return_tokens_as_token_ids": True,
        **extra,
    }
    reply = httpx.post(f"{stack.base_url}/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()  # type: ignore[no-any-return]


def _token_ids(choice: dict[str, Any]) -> list[int]:
    return [int(entry["token"].removeprefix("token_id:")) for entry in choice["logprobs"]["content"]]


@pytest.mark.parametrize("budget", [0, 1, 16])
def test_thinking_budget_is_exact_then_the_model_answers(thinking_stack: Stack, budget: int) -> None:
    tokens = httpx.post(f"{thinking_stack.base_url}/tokenize", json={"prompt": "</think>\n"}, timeout=30).json()
    think_end, newline = tokens["tokens"]
    reply = _thinking_reply(thinking_stack, budget)
    choice = reply["choices"][0]
    ids = _token_ids(choice)
    end = ids.index(think_end)
    # Exactly `budget` free thinking tokens, then a newline unless the last one already ended a line.
    assert end in (budget, budget + 1)
    if end == budget + 1:
        assert ids[budget] == newline
    assert think_end not in ids[:budget]
    assert reply["usage"]["completion_tokens_details"]["reasoning_tokens"] == end + 1
    assert reply["usage"]["reasoning_tokens"] == end + 1  # where SGLang clients read it
    assert choice["message"]["content"], "the model answers after the forced close"


def test_reasoning_streamed_equals_whole(thinking_stack: Stack) -> None:
    client = openai_client(thinking_stack)
    kwargs: dict[str, Any] = {
        "model": "",
        "messages": [{"role": "user", "content": "think"}],
        "max_tokens": 40,
        "temperature": 0,
        "extra_body": {"thinking_budget": 24, "min_tokens": 40},
    }
    whole = client.chat.completions.create(**kwargs).choices[0].message
    reasoning = getattr(whole, "reasoning_content", None)
    assert reasoning and whole.content

    reasoning_deltas, content = [], ""
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is not None:
            if getattr(delta, "reasoning_content", None):
                reasoning_deltas.append(delta.reasoning_content)  # type: ignore[attr-defined]
            content += delta.content or ""
    assert "".join(reasoning_deltas) == reasoning and content == whole.content
    assert len(reasoning_deltas) > 1

    held = client.chat.completions.create(
        **{**kwargs, "extra_body": {**kwargs["extra_body"], "stream_reasoning": False}}, stream=True
    )
    pieces = [
        c.choices[0].delta.reasoning_content
        for c in held
        if c.choices and getattr(c.choices[0].delta, "reasoning_content", None)
    ]  # type: ignore[attr-defined]
    assert pieces == [reasoning]


def test_responses_reasoning_item_is_chats_reasoning_content(thinking_stack: Stack) -> None:
    """/v1/responses with a reasoning parser: the thinking text is a `reasoning` output item before the
    message, whole and streamed, and its tokens are counted where OpenAI puts them."""
    client = openai_client(thinking_stack)
    extra = {"thinking_budget": 24, "ignore_eos": True}
    chat = client.chat.completions.create(
        model="", messages=[{"role": "user", "content": "think"}], max_tokens=40, temperature=0, extra_body=extra
    )
    reasoning = getattr(chat.choices[0].message, "reasoning_content", None)
    assert reasoning and chat.usage is not None and chat.usage.completion_tokens_details is not None
    kwargs: dict[str, Any] = {"model": "", "input": "think", "max_output_tokens": 40, "temperature": 0}
    reply = client.responses.create(**kwargs, extra_body=extra)
    assert [item.type for item in reply.output] == ["reasoning", "message"]
    assert reply.output[0].content[0].text == reasoning  # type: ignore[union-attr,index]
    assert reply.output_text == chat.choices[0].message.content
    assert reply.usage is not None
    assert reply.usage.output_tokens_details.reasoning_tokens == chat.usage.completion_tokens_details.reasoning_tokens

    events = list(client.responses.create(**kwargs, extra_body=extra, stream=True))
    deltas = [e.delta for e in events if e.type == "response.reasoning_text.delta"]
    assert "".join(deltas) == reasoning and len(deltas) > 1
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert added == ["reasoning", "message"]


def test_separate_reasoning_off_keeps_the_block_in_content(thinking_stack: Stack) -> None:
    reply = _thinking_reply(thinking_stack, 3, separate_reasoning=False)
    message = reply["choices"][0]["message"]
    # reasoning_content is always there (SGLang's shape), null when nothing was split out.
    assert message["reasoning_content"] is None and "</think>" in message["content"]


def test_enable_thinking_false_switches_the_qwen3_parser_off(thinking_stack: Stack) -> None:
    reply = _thinking_reply(thinking_stack, 3, chat_template_kwargs={"enable_thinking": False})
    message = reply["choices"][0]["message"]
    assert not message.get("reasoning_content") and "</think>" in message["content"]
    assert reply["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0


class OnlyToken(CustomLogitProcessor):
    """Samples custom_params["token_id"] every step (defined here, so it travels as code)."""

    def __call__(self, logits: Any, custom_param_list: list[dict[str, Any]]) -> Any:
        for row, params in enumerate(custom_param_list):
            logits[row, :] = float("-inf")
            logits[row, params["token_id"]] = 0.0
        return logits


def _generate(stack: Stack, processor: str, token_id: int) -> httpx.Response:
    body = {
        "text": "Hello",
        "custom_logit_processor": processor,
        "sampling_params": {"max_new_tokens": 4, "custom_params": {"token_id": token_id}},
    }
    return httpx.post(f"{stack.base_url}/generate", json=body, timeout=60)


def test_serialized_processor_needs_the_flag(tiny_stack: Stack, default_stack: Stack) -> None:
    refused = _generate(tiny_stack, OnlyToken().to_str(), 42)
    assert refused.status_code == 400
    assert "--enable-custom-logit-processor" in refused.json()["error"]["message"]
    allowed = _generate(default_stack, OnlyToken().to_str(), 42)
    assert allowed.status_code == 200, allowed.text
    assert allowed.json()["output_ids"] == [42] * 4
    builtin = _generate(tiny_stack, "deterministic_token", 43)
    assert builtin.status_code == 200 and builtin.json()["output_ids"] == [43] * 4
