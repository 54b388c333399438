"""Issue 5's HTTP fields: every spelling of a structured-output constraint, tools and
tool_choice, thinking budget aliases and custom logit processors reach the router as
the one proto form; reasoning text and tool calls come back in OpenAI's shapes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from google.protobuf.json_format import MessageToDict

from tests.gateway.conftest import FakeRouter, chunk, complete
from turnout.v1 import common_pb2, inference_pb2

CHAT = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "get_time", "description": "now"}},
]


def constraint(request: inference_pb2.GenerateRequest) -> tuple[str | None, Any]:
    sp = request.sampling_params
    kind = sp.WhichOneof("constraint")
    if kind is None:
        return None, None
    if kind == "choice":
        return kind, list(sp.choice.values)
    return kind, getattr(sp, kind)


@pytest.mark.parametrize(
    ("path", "extra", "kind", "value"),
    [
        ("/v1/chat/completions", {"response_format": {"type": "json_object"}}, "json_object", True),
        (
            "/v1/chat/completions",
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}},
            "json_schema",
            SCHEMA,
        ),
        ("/v1/completions", {"structured_outputs": {"json": SCHEMA}}, "json_schema", SCHEMA),
        ("/v1/completions", {"structured_outputs": {"json": json.dumps(SCHEMA)}}, "json_schema", SCHEMA),
        ("/v1/completions", {"structured_outputs": {"regex": "[ab]+"}}, "regex", "[ab]+"),
        ("/v1/completions", {"structured_outputs": {"choice": ["yes", "no"]}}, "choice", ["yes", "no"]),
        ("/v1/completions", {"structured_outputs": {"grammar": 'root ::= "a"'}}, "ebnf", 'root ::= "a"'),
        ("/v1/completions", {"structured_outputs": {"json_object": True}}, "json_object", True),
        ("/v1/completions", {"guided_json": SCHEMA}, "json_schema", SCHEMA),
        ("/v1/completions", {"guided_regex": "\\d+"}, "regex", "\\d+"),
        ("/v1/chat/completions", {"guided_choice": ["a", "b"]}, "choice", ["a", "b"]),
        ("/v1/chat/completions", {"guided_grammar": 'root ::= "b"'}, "ebnf", 'root ::= "b"'),
        ("/v1/chat/completions", {"regex": "x+"}, "regex", "x+"),
        ("/v1/chat/completions", {"ebnf": 'root ::= "c"'}, "ebnf", 'root ::= "c"'),
        ("/v1/chat/completions", {"response_format": {"type": "text"}}, None, None),
    ],
)
async def test_every_constraint_spelling_reaches_the_router(
    client: httpx.AsyncClient, fake_router: FakeRouter, path: str, extra: dict[str, Any], kind: str | None, value: Any
) -> None:
    base = {"prompt": "x"} if path == "/v1/completions" else {"messages": CHAT}
    response = await client.post(path, json={**base, **extra})
    assert response.status_code == 200, response.text
    got_kind, got_value = constraint(fake_router.requests[0])
    assert got_kind == kind
    assert (json.loads(got_value) if kind == "json_schema" else got_value) == value


async def test_structural_tag_response_format_is_passed_whole(
    client: httpx.AsyncClient, fake_router: FakeRouter
) -> None:
    fmt = {
        "type": "structural_tag",
        "structures": [{"begin": "<f>", "schema": SCHEMA, "end": "</f>"}],
        "triggers": ["<f>"],
    }
    response = await client.post("/v1/chat/completions", json={"messages": CHAT, "response_format": fmt})
    assert response.status_code == 200, response.text
    kind, value = constraint(fake_router.requests[0])
    assert kind == "structural_tag" and json.loads(value) == fmt


@pytest.mark.parametrize("as_text", [True, False])
async def test_vllm_top_level_structural_tag(client: httpx.AsyncClient, fake_router: FakeRouter, as_text: bool) -> None:
    """vLLM's `structural_tag` extra field (JSON text; an object too) is the same constraint."""
    tag = {
        "type": "structural_tag",
        "structures": [{"begin": "<f>", "schema": SCHEMA, "end": "</f>"}],
        "triggers": ["<f>"],
    }
    body = {"messages": CHAT, "structural_tag": json.dumps(tag) if as_text else tag}
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    kind, value = constraint(fake_router.requests[0])
    assert kind == "structural_tag" and json.loads(value) == tag


async def test_whitespace_and_closed_objects(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    nested = {"type": "object", "properties": {"b": {"type": "object"}}}
    body = {
        "prompt": "x",
        "structured_outputs": {"json": nested, "disable_any_whitespace": True, "disable_additional_properties": True},
    }
    assert (await client.post("/v1/completions", json=body)).status_code == 200
    sp = fake_router.requests[0].sampling_params
    assert sp.disable_any_whitespace
    closed = json.loads(sp.json_schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["b"]["additionalProperties"] is False

    body = {"prompt": "x", "guided_json": SCHEMA, "guided_decoding_backend": "xgrammar:disable-any-whitespace"}
    assert (await client.post("/v1/completions", json=body)).status_code == 200
    assert fake_router.requests[1].sampling_params.disable_any_whitespace

    body = {"text": "x", "sampling_params": {"json_schema": json.dumps(SCHEMA), "disable_any_whitespace": True}}
    assert (await client.post("/generate", json=body)).status_code == 200
    assert fake_router.requests[2].sampling_params.disable_any_whitespace


@pytest.mark.parametrize(
    ("path", "extra", "param"),
    [
        ("/v1/completions", {"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
        ("/v1/chat/completions", {"response_format": {"type": "json_object"}, "regex": "a"}, "regex"),
        ("/v1/completions", {"structured_outputs": {"regex": "a", "grammar": "b"}}, "structured_outputs.grammar"),
        ("/v1/completions", {"structured_outputs": {"jsn": {}}}, "structured_outputs"),
        ("/v1/completions", {"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
        (
            "/v1/completions",
            {"structured_outputs": {"whitespace_pattern": " "}},
            "structured_outputs.whitespace_pattern",
        ),
        ("/v1/completions", {"guided_json": "{not json"}, "guided_json"),
        ("/v1/completions", {"guided_json": "[1]"}, "guided_json"),
        ("/v1/chat/completions", {"response_format": {"type": "xml"}}, "response_format.type"),
        ("/v1/chat/completions", {"guided_choice": []}, "guided_choice"),
        # Deeper than Python's json can parse: a 400, not a RecursionError (the engine bounds real depth).
        ("/v1/completions", {"guided_json": "[" * 100_000}, "guided_json"),
        ("/v1/completions", {"structured_outputs": {"json": "[" * 100_000}}, "structured_outputs.json"),
        (
            "/v1/completions",
            {"structured_outputs": {"json": "[" * 100_000, "disable_additional_properties": True}},
            "structured_outputs.json",
        ),
    ],
)
async def test_bad_constraints_are_400(
    client: httpx.AsyncClient, fake_router: FakeRouter, path: str, extra: dict[str, Any], param: str
) -> None:
    base = {"prompt": "x"} if path == "/v1/completions" else {"messages": CHAT}
    response = await client.post(path, json={**base, **extra})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
    assert fake_router.requests == []


@pytest.mark.parametrize(
    ("extra", "mode", "name"),
    [
        ({"tools": TOOLS}, common_pb2.ToolCalling.AUTO, ""),
        ({"tools": TOOLS, "tool_choice": "auto"}, common_pb2.ToolCalling.AUTO, ""),
        ({"tools": TOOLS, "tool_choice": "none"}, common_pb2.ToolCalling.NONE, ""),
        ({"tools": TOOLS, "tool_choice": "required"}, common_pb2.ToolCalling.REQUIRED, ""),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
            common_pb2.ToolCalling.NAMED,
            "get_time",
        ),
        ({}, common_pb2.ToolCalling.MODE_UNSPECIFIED, ""),
        ({"tool_choice": "none"}, common_pb2.ToolCalling.MODE_UNSPECIFIED, ""),
    ],
)
async def test_tool_choice_becomes_the_tool_calling_mode(
    client: httpx.AsyncClient, fake_router: FakeRouter, extra: dict[str, Any], mode: int, name: str
) -> None:
    response = await client.post("/v1/chat/completions", json={"messages": CHAT, **extra})
    assert response.status_code == 200, response.text
    request = fake_router.requests[0]
    assert request.tool_calling.mode == mode
    assert request.tool_calling.function_name == name
    assert [MessageToDict(t) for t in request.chat.options.tools] == extra.get("tools", [])


async def test_parallel_tool_calls_is_passed(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    body = {"messages": CHAT, "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}
    assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    calling = fake_router.requests[0].tool_calling
    assert calling.HasField("parallel") and not calling.parallel


@pytest.mark.parametrize(
    ("extra", "param", "words"),
    [
        ({"tools": []}, "tools", "must not be empty"),
        ({"tool_choice": "required"}, "tool_choice", "requires 'tools'"),
        ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice", "requires 'tools'"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            "'nope', which is not in 'tools'",
        ),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "tools", "more than once"),
        ({"tools": TOOLS, "tool_choice": "required", "guided_regex": "a"}, "tool_choice", "cannot be combined"),
        ({"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name", ""),
        ({"tool_choice": "sometimes"}, "tool_choice", ""),
    ],
)
async def test_bad_tools_are_400(
    client: httpx.AsyncClient, fake_router: FakeRouter, extra: dict[str, Any], param: str, words: str
) -> None:
    response = await client.post("/v1/chat/completions", json={"messages": CHAT, **extra})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert words in error["message"]
    assert fake_router.requests == []


@pytest.mark.parametrize(
    ("path", "extra", "budget"),
    [
        ("/v1/chat/completions", {"thinking_budget": 16}, 16),
        ("/v1/chat/completions", {"max_thinking_tokens": 8}, 8),
        ("/v1/completions", {"thinking_token_budget": 0}, 0),
        ("/v1/chat/completions", {"custom_params": {"thinking_budget": 5}}, 5),
        ("/v1/chat/completions", {"reasoning_effort": "low"}, 1024),
        ("/v1/chat/completions", {"reasoning_effort": "low", "thinking_budget": 3}, 3),
        ("/v1/chat/completions", {"reasoning_effort": "high"}, None),
        ("/v1/chat/completions", {}, None),
        ("/generate", {"sampling_params": {"thinking_budget": 7}}, 7),
        ("/generate", {"sampling_params": {"custom_params": {"thinking_budget": 9}}}, 9),
    ],
)
async def test_thinking_budget_spellings(
    client: httpx.AsyncClient, fake_router: FakeRouter, path: str, extra: dict[str, Any], budget: int | None
) -> None:
    base = {"prompt": "x"} if path == "/v1/completions" else {"messages": CHAT}
    if path == "/generate":
        base = {"text": "x"}
    response = await client.post(path, json={**base, **extra})
    assert response.status_code == 200, response.text
    sp = fake_router.requests[0].sampling_params
    assert (sp.thinking_budget if sp.HasField("thinking_budget") else None) == budget


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"thinking_budget": 3, "max_thinking_tokens": 4}, "thinking_budget"),
        ({"custom_params": {"thinking_budget": -1}}, "custom_params"),
        ({"custom_params": {"thinking_budget": "many"}}, "custom_params"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"thinking_budget": -1}, "thinking_budget"),
    ],
)
async def test_bad_thinking_budget_is_400(
    client: httpx.AsyncClient, fake_router: FakeRouter, extra: dict[str, Any], param: str
) -> None:
    response = await client.post("/v1/chat/completions", json={"messages": CHAT, **extra})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


async def test_custom_logit_processor_fields(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    body = {"messages": CHAT, "custom_logit_processor": "deterministic_token", "custom_params": {"token_id": 5}}
    assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    sp = fake_router.requests[0].sampling_params
    assert sp.custom_logit_processor == "deterministic_token"
    assert MessageToDict(sp.custom_params) == {"token_id": 5.0}

    body = {
        "text": ["a", "b"],
        "custom_logit_processor": ["deterministic_token", None],
        "sampling_params": {"custom_params": {"token_id": 7}},
    }
    assert (await client.post("/generate", json=body)).status_code == 200
    first, second = fake_router.requests[1:]
    assert first.sampling_params.custom_logit_processor == "deterministic_token"
    assert not second.sampling_params.HasField("custom_logit_processor")

    body = {"text": ["a", "b"], "custom_logit_processor": ["deterministic_token"]}
    assert (await client.post("/generate", json=body)).status_code == 400


async def test_custom_params_thinking_budget_rides_on_the_budget_field(
    client: httpx.AsyncClient, fake_router: FakeRouter
) -> None:
    """Without a processor the engine refuses custom_params, so SGLang's budget key becomes the field;
    a processor of the client's own still sees it."""
    body = {"messages": CHAT, "custom_params": {"thinking_budget": 4}}
    assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    sp = fake_router.requests[0].sampling_params
    assert sp.thinking_budget == 4 and not sp.HasField("custom_params")
    body = {"messages": CHAT, "custom_params": {"thinking_budget": 4}, "custom_logit_processor": "{}"}
    assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    assert MessageToDict(fake_router.requests[1].sampling_params.custom_params) == {"thinking_budget": 4.0}


async def test_separate_reasoning_defaults_on(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    assert (await client.post("/v1/chat/completions", json={"messages": CHAT})).status_code == 200
    body = {"messages": CHAT, "separate_reasoning": False}
    assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    assert [r.separate_reasoning for r in fake_router.requests] == [True, False]


def _chunk(**fields: Any) -> inference_pb2.GenerateResponse:
    response = chunk()
    for name, value in fields.items():
        if name in ("tool_calls", "token_ids"):
            getattr(response.chunk, name).extend(value)
        else:
            setattr(response.chunk, name, value)
    return response


async def _thinking_then_tool_call(
    request: inference_pb2.GenerateRequest, context: Any
) -> AsyncIterator[inference_pb2.GenerateResponse]:
    delta = common_pb2.ToolCallDelta
    yield _chunk(reasoning_text="Let me ", token_ids=[1, 2], completion_tokens=2, reasoning_tokens=2)
    yield _chunk(reasoning_text="check.", token_ids=[3], completion_tokens=3, reasoning_tokens=3)
    yield _chunk(text="Sure. ", token_ids=[4], completion_tokens=4, reasoning_tokens=3)
    yield _chunk(
        tool_calls=[delta(index=0, id="call_1", name="get_weather", arguments='{"city": ')],
        token_ids=[5],
        completion_tokens=5,
        reasoning_tokens=3,
    )
    yield _chunk(
        tool_calls=[delta(index=0, arguments='"Paris"}'), delta(index=1, id="call_2", name="get_time")],
        token_ids=[6],
        completion_tokens=6,
        reasoning_tokens=3,
    )
    yield _chunk(tool_calls=[delta(index=1, arguments="{}")], token_ids=[7], completion_tokens=7, reasoning_tokens=3)
    done = complete(completion=7, eos_token_id=2)
    done.complete.usage.reasoning_tokens = 3
    yield done


async def test_reasoning_and_tool_calls_in_the_body(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    fake_router.script = _thinking_then_tool_call
    body = {"messages": CHAT, "tools": TOOLS}
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    result = response.json()
    choice = result["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {
        "role": "assistant",
        "content": "Sure. ",
        "reasoning_content": "Let me check.",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
        ],
    }
    assert result["usage"]["completion_tokens_details"] == {"reasoning_tokens": 3}  # OpenAI's place
    assert result["usage"]["reasoning_tokens"] == 3  # SGLang's place


async def test_named_tool_choice_finishes_with_stop(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    fake_router.script = _thinking_then_tool_call
    body = {"messages": CHAT, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}}}
    response = await client.post("/v1/chat/completions", json=body)
    assert response.json()["choices"][0]["finish_reason"] == "stop"


async def _stream(client: httpx.AsyncClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    events = []
    async with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return events


async def test_streamed_reasoning_and_tool_call_deltas(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    fake_router.script = _thinking_then_tool_call
    events = await _stream(client, {"messages": CHAT, "tools": TOOLS})
    deltas = [e["choices"][0]["delta"] for e in events]
    # Every delta carries the reasoning_content key, null when it has none (as SGLang's do).
    assert all("reasoning_content" in d for d in deltas)
    deltas = [{k: v for k, v in d.items() if v is not None or k != "reasoning_content"} for d in deltas]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert deltas[1:4] == [{"reasoning_content": "Let me "}, {"reasoning_content": "check."}, {"content": "Sure. "}]
    assert deltas[4] == {
        "tool_calls": [
            {
                "index": 0,
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": '},
            }
        ]
    }
    assert deltas[5]["tool_calls"] == [
        {"index": 0, "function": {"arguments": '"Paris"}'}},
        {"index": 1, "id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": ""}},
    ]
    assert deltas[6]["tool_calls"] == [{"index": 1, "function": {"arguments": "{}"}}]
    finishes = [e["choices"][0]["finish_reason"] for e in events]
    assert finishes == [None] * 7 + ["tool_calls"]


async def test_stream_reasoning_false_sends_reasoning_in_one_piece(
    client: httpx.AsyncClient, fake_router: FakeRouter
) -> None:
    fake_router.script = _thinking_then_tool_call
    events = await _stream(client, {"messages": CHAT, "tools": TOOLS, "stream_reasoning": False})
    deltas = [e["choices"][0]["delta"] for e in events]
    assert deltas[1] == {"reasoning_content": "Let me check.", "content": "Sure. "}
    assert sum(d["reasoning_content"] is not None for d in deltas) == 1
