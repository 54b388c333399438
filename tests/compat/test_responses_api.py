"""The official `openai` client's Responses API (`client.responses.create`, streamed and not) against a
live stack, held to what /v1/chat/completions answers greedily for the same conversation."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

from tests.compat.conftest import MODEL

pytestmark = [pytest.mark.e2e, pytest.mark.default_model]

QUESTION = "What is the capital of France?"
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOL = {"type": "function", "name": "get_weather", "description": "Weather now", "parameters": WEATHER}


def chat_text(client: openai.OpenAI, messages: list[Any], max_tokens: int) -> str:
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=max_tokens, temperature=0)
    return reply.choices[0].message.content or ""


def test_create_and_stream_equal_chat_greedy(client: openai.OpenAI) -> None:
    expected = chat_text(client, [{"role": "user", "content": QUESTION}], 24)
    assert expected
    reply = client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=24, temperature=0)
    assert reply.status in ("completed", "incomplete") and reply.object == "response"
    assert reply.output_text == expected
    assert reply.usage is not None and reply.usage.output_tokens > 0
    assert reply.usage.total_tokens == reply.usage.input_tokens + reply.usage.output_tokens

    stream = client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=24, temperature=0, stream=True)
    events = list(stream)
    assert events[0].type == "response.created" and events[1].type == "response.in_progress"
    assert events[-1].type in ("response.completed", "response.incomplete")
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    (done,) = [e.text for e in events if e.type == "response.output_text.done"]
    final = events[-1].response  # type: ignore[union-attr]
    assert deltas == done == final.output_text == expected
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_max_output_tokens_makes_it_incomplete(client: openai.OpenAI) -> None:
    reply = client.responses.create(
        model=MODEL, input="Tell me a long story.", max_output_tokens=3, temperature=0, extra_body={"ignore_eos": True}
    )
    assert reply.status == "incomplete"
    assert reply.incomplete_details is not None and reply.incomplete_details.reason == "max_output_tokens"
    assert reply.usage is not None and reply.usage.output_tokens == 3


def test_instructions_and_previous_response_id_continue_the_conversation(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model=MODEL, input="My name is Ann.", instructions="Be brief.", max_output_tokens=16, temperature=0
    )
    assert first.output_text == chat_text(
        client, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "My name is Ann."}], 16
    )
    second = client.responses.create(
        model=MODEL, input="What is my name?", previous_response_id=first.id, max_output_tokens=16, temperature=0
    )
    # OpenAI's rule: the earlier instructions are not carried over, its input and output are.
    history = [
        {"role": "user", "content": "My name is Ann."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"},
    ]
    assert second.output_text == chat_text(client, history, 16)
    assert second.previous_response_id == first.id
    assert client.responses.retrieve(first.id).output_text == first.output_text
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        client.responses.create(model=MODEL, input="Again?", previous_response_id=first.id)


def test_function_tool_round_trip(client: openai.OpenAI) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    choice: Any = {"type": "function", "name": "get_weather"}
    kwargs: dict[str, Any] = {"model": MODEL, "tools": [TOOL], "tool_choice": choice, "max_output_tokens": 48}
    reply = client.responses.create(input=ask, temperature=0, **kwargs)
    (call,) = [item for item in reply.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id
    jsonschema.validate(json.loads(call.arguments), WEATHER)

    events = list(client.responses.create(input=ask, temperature=0, stream=True, **kwargs))
    arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert arguments == done.arguments == call.arguments

    # The call and its output go back as input items; the model answers in text.
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "21 C, sunny"}
    follow_up = [*ask, call.model_dump(exclude_none=True), output]
    answer = client.responses.create(
        model=MODEL, input=follow_up, tools=[TOOL], tool_choice="none", max_output_tokens=16, temperature=0
    )
    assert answer.output_text and not [i for i in answer.output if i.type == "function_call"]
    messages: list[Any] = [
        *ask,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "21 C, sunny"},
    ]
    function = {"name": "get_weather", "description": "Weather now", "parameters": WEATHER}
    chat_tool: Any = {"type": "function", "function": function}
    expected = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[chat_tool], tool_choice="none", max_tokens=16, temperature=0
    )
    assert answer.output_text == expected.choices[0].message.content


def test_json_schema_text_format(client: openai.OpenAI) -> None:
    fmt: Any = {"type": "json_schema", "name": "city", "schema": WEATHER, "strict": True}
    reply = client.responses.create(
        model=MODEL, input="Name a city as JSON.", text={"format": fmt}, max_output_tokens=32, temperature=0
    )
    jsonschema.validate(json.loads(reply.output_text), WEATHER)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"background": True}, "background"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"previous_response_id": "resp_unknown"}, "previous_response_id"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
    ],
)
def test_refused_with_a_400_naming_the_field(client: openai.OpenAI, extra: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input=QUESTION, extra_body=extra)
    body: Any = caught.value.body
    assert body["param"] == param
