"""`/v1/responses` against the fake router: what reaches the router, the Response object and the
typed stream events the official `openai` client parses, the store, and the 400s."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from google.protobuf.json_format import MessageToDict

from gateway.config import GatewayConfig
from tests.gateway.conftest import FakeRouter, chunk, complete
from turnout.v1 import common_pb2, inference_pb2

TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}


def typed_events(body: str) -> list[dict[str, Any]]:
    """Parse a typed SSE body: each frame `event: {type}` + `data: {json}` with the same type, no [DONE]."""
    frames = body.split("\n\n")
    assert frames[-1] == ""
    events = []
    for frame in frames[:-1]:
        event_line, data_line = frame.split("\n")
        event = json.loads(data_line.removeprefix("data: "))
        assert event_line == f"event: {event['type']}"
        events.append(event)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    return events


def messages(request: inference_pb2.GenerateRequest) -> list[dict[str, Any]]:
    return [MessageToDict(m) for m in request.chat.messages]


@pytest.fixture
async def sdk(live_gateway: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=f"{live_gateway}/v1", api_key="unused", max_retries=0) as client:
        yield client


async def test_sdk_create_and_stream_agree(sdk: openai.AsyncOpenAI, fake_router: FakeRouter) -> None:
    reply = await sdk.responses.create(model="tiny", input="Hi", instructions="Be brief.", max_output_tokens=9)
    assert reply.id.startswith("resp_") and reply.object == "response" and reply.status == "completed"
    assert reply.output_text == "Hello world"
    (item,) = reply.output
    assert item.type == "message" and item.id.startswith("msg_") and item.status == "completed"
    assert reply.usage is not None
    assert (reply.usage.input_tokens, reply.usage.output_tokens, reply.usage.total_tokens) == (5, 3, 8)
    assert reply.usage.input_tokens_details.cached_tokens == 1
    assert reply.usage.output_tokens_details.reasoning_tokens == 0
    sent = fake_router.requests[0]
    assert messages(sent) == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert sent.sampling_params.max_new_tokens == 9

    stream = await sdk.responses.create(model="tiny", input="Hi", stream=True)
    events = [e async for e in stream]
    kinds = [e.type for e in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert "".join(d.delta for d in deltas) == "Hello world"
    item_id = events[2].item.id  # type: ignore[union-attr]
    assert all(d.item_id == item_id and d.output_index == 0 and d.content_index == 0 for d in deltas)
    final = events[-1].response  # type: ignore[union-attr]
    assert final.output_text == "Hello world" and final.status == "completed" and final.usage is not None

    # The SDK's stream helper checks that items keep their identity from added to done.
    async with sdk.responses.stream(model="tiny", input="Hi") as helper:
        texts = [e.delta async for e in helper if e.type == "response.output_text.delta"]
        accumulated = await helper.get_final_response()
    assert "".join(texts) == accumulated.output_text == "Hello world"


async def test_max_output_tokens_is_incomplete(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    async def script(request: Any, context: Any) -> AsyncIterator[Any]:
        yield chunk(0, "Hel", (11,), completion=1)
        yield complete(0, length=1)

    fake_router.script = script
    reply = (await client.post("/v1/responses", json={"input": "Hi", "max_output_tokens": 1})).json()
    assert reply["status"] == "incomplete" and reply["incomplete_details"] == {"reason": "max_output_tokens"}
    assert reply["output"][0]["status"] == "incomplete"
    body = (await client.post("/v1/responses", json={"input": "Hi", "max_output_tokens": 1, "stream": True})).text
    events = typed_events(body)
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


async def test_reasoning_and_tool_call_items(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    async def script(request: Any, context: Any) -> AsyncIterator[Any]:
        first = chunk(0, "", (11,), completion=1)
        first.chunk.reasoning_text = "think"
        first.chunk.reasoning_tokens = 1
        yield first
        yield chunk(0, "Sure. ", (12,), completion=2)
        call = chunk(0, "", (13,), completion=3)
        call.chunk.tool_calls.add(index=0, id="call_1", name="get_weather", arguments='{"city": ')
        yield call
        more = chunk(0, "", (14,), completion=4)
        more.chunk.tool_calls.add(index=0, arguments='"Paris"}')
        yield more
        end = complete(0, completion=4, token_id=2)
        end.complete.usage.reasoning_tokens = 1
        yield end

    fake_router.script = script
    request = {"input": "Weather?", "tools": [TOOL], "reasoning": {"effort": "low"}}
    reply = (await client.post("/v1/responses", json=request)).json()
    assert [i["type"] for i in reply["output"]] == ["reasoning", "message", "function_call"]
    reasoning, message, call = reply["output"]
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "think"}] and reasoning["summary"] == []
    assert message["content"][0]["text"] == "Sure. "
    assert (call["call_id"], call["name"], call["arguments"]) == ("call_1", "get_weather", '{"city": "Paris"}')
    assert reply["usage"]["output_tokens_details"]["reasoning_tokens"] == 1
    sent = fake_router.requests[0]
    assert sent.tool_calling.mode == common_pb2.ToolCalling.AUTO
    function = {"name": "get_weather", "parameters": {"type": "object"}}
    assert MessageToDict(sent.chat.options.tools[0]) == {"type": "function", "function": function}
    assert sent.sampling_params.thinking_budget == 1024

    events = typed_events((await client.post("/v1/responses", json={**request, "stream": True})).text)
    args = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert "".join(args) == '{"city": "Paris"}'
    assert [e["delta"] for e in events if e["type"] == "response.reasoning_text.delta"] == ["think"]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [d["type"] for d in done] == ["reasoning", "message", "function_call"]
    assert [i["id"] for i in done] == [i["id"] for i in events[-1]["response"]["output"]]
    assert {k: v for k, v in done[2].items() if k != "id"} == {k: v for k, v in call.items() if k != "id"}


async def test_input_items_become_chat_messages(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    items = [
        {"role": "developer", "content": [{"type": "input_text", "text": "Use "}, {"type": "input_text", "text": "X"}]},
        {"type": "message", "role": "user", "content": "Weather?"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}", "id": "fc_1"},
        {"type": "function_call_output", "call_id": "call_1", "output": "21C"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "21C.", "annotations": []}]},
    ]
    assert (await client.post("/v1/responses", json={"input": items, "tools": [TOOL]})).status_code == 200
    assert messages(fake_router.requests[0]) == [
        {"role": "developer", "content": "Use X"},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "reasoningContent": "hmm",
            "toolCalls": [{"id": "call_1", "type": "function", "name": "get_weather", "arguments": "{}"}],
        },
        {"role": "tool", "content": "21C", "toolCallId": "call_1"},
        {"role": "assistant", "content": "21C."},
    ]


async def test_previous_response_id_continues_and_the_store(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    first = (await client.post("/v1/responses", json={"input": "Hi", "instructions": "Old."})).json()
    second = (await client.post("/v1/responses", json={"input": "More", "previous_response_id": first["id"]})).json()
    assert second["previous_response_id"] == first["id"]
    # The earlier instructions are not carried over (OpenAI's rule); its input and output are.
    assert messages(fake_router.requests[1]) == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello world"},
        {"role": "user", "content": "More"},
    ]
    assert (await client.get(f"/v1/responses/{first['id']}")).json() == first
    deleted = await client.delete(f"/v1/responses/{first['id']}")
    assert deleted.json() == {"id": first["id"], "object": "response.deleted", "deleted": True}
    assert (await client.get(f"/v1/responses/{first['id']}")).status_code == 404
    gone = await client.post("/v1/responses", json={"input": "x", "previous_response_id": first["id"]})
    assert gone.status_code == 400 and gone.json()["error"]["param"] == "previous_response_id"
    unstored = (await client.post("/v1/responses", json={"input": "Hi", "store": False})).json()
    assert unstored["store"] is False
    assert (await client.get(f"/v1/responses/{unstored['id']}")).status_code == 404


@pytest.mark.parametrize("in_file", [False, True], ids=["memory", "sqlite"])
async def test_store_keeps_the_most_recent(
    make_client: Callable[[GatewayConfig], AsyncIterator[httpx.AsyncClient]],
    fake_router: FakeRouter,
    tmp_path: Path,
    in_file: bool,
) -> None:
    shared = str(tmp_path / "responses.sqlite") if in_file else None
    config = GatewayConfig(router_address=fake_router.address, responses_store_size=2, responses_store_file=shared)
    async for client in make_client(config):
        ids = [(await client.post("/v1/responses", json={"input": "Hi"})).json()["id"] for _ in range(3)]
        assert [(await client.get(f"/v1/responses/{i}")).status_code for i in ids] == [404, 200, 200]
        # A get counts as a use: the older of the two is the one a new response evicts.
        assert (await client.get(f"/v1/responses/{ids[1]}")).status_code == 200
        newest = (await client.post("/v1/responses", json={"input": "Hi"})).json()["id"]
        assert [(await client.get(f"/v1/responses/{i}")).status_code for i in (ids[1], ids[2], newest)] == [
            200,
            404,
            200,
        ]
        evicted = await client.post("/v1/responses", json={"input": "x", "previous_response_id": ids[0]})
        assert evicted.status_code == 400 and "previous_response_id" in evicted.json()["error"]["message"]


async def test_gateways_sharing_a_store_file_continue_each_others_responses(
    make_client: Callable[[GatewayConfig], AsyncIterator[httpx.AsyncClient]], fake_router: FakeRouter, tmp_path: Path
) -> None:
    # What `turnout serve --api-server-count 2` runs: two gateways, one file; a follow-up reaches either.
    items = [
        {"role": "developer", "content": [{"type": "input_text", "text": "Use X"}]},
        {"type": "message", "role": "user", "content": "Weather?"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}", "id": "fc_1"},
        {"type": "function_call_output", "call_id": "call_1", "output": "21C"},
    ]
    first_body = {"input": items, "tools": [TOOL], "instructions": "Old."}

    async def continued(one: httpx.AsyncClient, other: httpx.AsyncClient) -> list[dict[str, Any]]:
        """The chat messages a follow-up through `other` sends, for a response `one` made."""
        first = (await one.post("/v1/responses", json=first_body)).json()
        assert (await other.get(f"/v1/responses/{first['id']}")).json() == first
        second = await other.post("/v1/responses", json={"input": "More", "previous_response_id": first["id"]})
        assert second.status_code == 200
        assert (await other.delete(f"/v1/responses/{first['id']}")).status_code == 200
        assert (await one.get(f"/v1/responses/{first['id']}")).status_code == 404
        return messages(fake_router.requests[-1])

    config = GatewayConfig(router_address=fake_router.address)
    async for alone in make_client(config):
        in_memory = await continued(alone, alone)
    shared = GatewayConfig(router_address=fake_router.address, responses_store_file=str(tmp_path / "r.sqlite"))
    async for one in make_client(shared):
        async for other in make_client(shared):
            # The conversation read back from the file is the one kept in memory, to the last field.
            assert await continued(one, other) == in_memory


async def test_text_format_is_the_chat_constraint(client: httpx.AsyncClient, fake_router: FakeRouter) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "name": "x", "schema": schema, "strict": True}
    reply = (await client.post("/v1/responses", json={"input": "Hi", "text": {"format": fmt}})).json()
    assert json.loads(fake_router.requests[0].sampling_params.json_schema) == schema
    assert reply["text"]["format"] == fmt
    await client.post("/v1/responses", json={"input": "Hi", "text": {"format": {"type": "json_object"}}})
    assert fake_router.requests[1].sampling_params.json_object


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"background": True}, "background"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tool_choice": {"type": "file_search"}}, "tool_choice"),
        ({"include": ["reasoning.encrypted_content"]}, "include"),
        ({"truncation": "auto"}, "truncation"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"max_tool_calls": 3}, "max_tool_calls"),
        ({"n": 2}, "n"),
        ({"reasoning": {"summary": "auto"}}, "reasoning.summary"),
        ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ({"text": {"verbosity": "low"}}, "text.verbosity"),
        ({"input": [{"type": "web_search_call", "id": "x"}]}, "input[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
        ({"input": [{"role": "critic", "content": "x"}]}, "input[0].role"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
        ({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "x"}]}, "input[0].encrypted_content"),
        ({"input": []}, "input"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"temperature": "hot"}, "temperature"),
    ],
)
async def test_refused_with_the_field_named(
    client: httpx.AsyncClient, fake_router: FakeRouter, body: dict[str, Any], param: str
) -> None:
    reply = await client.post("/v1/responses", json={"input": "Hi", **body})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param
    assert not fake_router.requests


async def test_unknown_response_id_is_404(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v1/responses/resp_nope")).status_code == 404
    assert (await client.delete("/v1/responses/resp_nope")).status_code == 404


async def test_a_failure_mid_stream_is_an_error_event_and_not_stored(
    client: httpx.AsyncClient, fake_router: FakeRouter
) -> None:
    async def script(request: Any, context: Any) -> AsyncIterator[Any]:
        yield chunk(0, "Hel", (11,), completion=1)
        yield complete(0, abort="engine lost")

    fake_router.script = script
    events = typed_events((await client.post("/v1/responses", json={"input": "Hi", "stream": True})).text)
    assert events[-1]["type"] == "error" and "engine lost" in events[-1]["message"]
    assert [e["delta"] for e in events if e["type"] == "response.output_text.delta"] == ["Hel"]
    response_id = events[0]["response"]["id"]
    assert (await client.get(f"/v1/responses/{response_id}")).status_code == 404
