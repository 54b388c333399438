"""Bounded work per request through the real stack: every limit is a 400 over HTTP and
INVALID_ARGUMENT over the router's public gRPC, with a message naming the limit and its flag,
answered at once (nothing is allocated per sample or compiled first), and the stack keeps serving."""

from __future__ import annotations

import json
import time
from typing import Any

import grpc
import httpx
import pytest

from tests.e2e.stack import Stack
from turnout.v1 import common_pb2, inference_pb2, inference_pb2_grpc

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def http(tiny_stack: Stack) -> httpx.Client:
    return httpx.Client(base_url=tiny_stack.base_url, timeout=120)


def refused(http: httpx.Client, body: dict[str, Any], message: str, path: str = "/v1/completions") -> None:
    started = time.monotonic()
    reply = http.post(path, json={"prompt": "hi", "max_tokens": 2, **body})
    assert reply.status_code == 400, reply.text
    assert message in reply.json()["error"]["message"], reply.text
    assert time.monotonic() - started < 30


def deep_schema(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth - 1):
        schema = {"type": "array", "items": schema}
    return schema


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"n": 4294967295}, "n must be at most 128 (the server's --max-n), got 4294967295"),
        ({"n": 2, "best_of": 4294967295}, "best_of must be at most 128 (the server's --max-n)"),
        ({"stop": [f"s{i}" for i in range(65)]}, "at most 64 are allowed (the server's --max-stop-sequences)"),
        ({"stop": ["x" * 5000]}, "at most 1024 are allowed (the server's --max-stop-sequence-length)"),
        ({"guided_json": json.dumps(deep_schema(300))}, "at most 64 are allowed (the server's --max-grammar-depth)"),
        ({"guided_json": "[" * 100_000}, "nested too deeply"),
        ({"guided_regex": "a" * (1 << 20 | 1)}, "(the server's --max-grammar-bytes)"),
        ({"guided_json": {"$ref": "#"}}, "$ref cycle # -> #"),
        (
            {"guided_json": {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}},
            "$ref cycle # -> #/$defs/a -> #/$defs/a",
        ),
        ({"guided_json": {"$ref": "file:///etc/passwd"}}, "is not a local reference"),
        ({"stop": [""]}, "'stop' must not contain empty strings"),
    ],
)
def test_over_a_limit_is_a_400_naming_it(http: httpx.Client, body: dict[str, Any], message: str) -> None:
    refused(http, body, message)


def test_a_chat_schema_over_the_depth_limit(http: httpx.Client) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "deep", "schema": deep_schema(100)}}
    body = {"messages": [{"role": "user", "content": "hi"}], "response_format": fmt}
    refused(http, body, "(the server's --max-grammar-depth)", "/v1/chat/completions")


def test_a_recursive_schema_through_a_real_schema_is_served(http: httpx.Client) -> None:
    kids = {"type": "array", "items": {"$ref": "#/$defs/node"}}
    tree = {"$defs": {"node": {"type": "object", "properties": {"kids": kids}}}, "$ref": "#/$defs/node"}
    reply = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4, "guided_json": tree})
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"stop": [""]}, "stop[0] is empty"),
        # The tokenizer's stop matcher, which sees the request before the engine, names it first.
        ({"stop_regex": ["a", ""]}, "stop_regex '' matches the empty string"),
        ({"n": 4294967295}, "--max-n"),
        ({"json_schema": '{"$ref": "https://example.com/schema.json"}'}, "is not a local reference"),
    ],
)
def test_the_routers_grpc_refuses_the_same(tiny_stack: Stack, params: dict[str, Any], message: str) -> None:
    request = inference_pb2.GenerateRequest(
        text="hi", sampling_params=common_pb2.SamplingParams(max_new_tokens=2, **params)
    )
    with (
        grpc.insecure_channel(f"127.0.0.1:{tiny_stack.router_port}") as channel,
        pytest.raises(grpc.RpcError) as caught,
    ):
        list(inference_pb2_grpc.InferenceStub(channel).Generate(request, timeout=60))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (caught.value.details() or "")


def test_the_stack_still_serves_and_the_engine_holds_nothing(http: httpx.Client, tiny_stack: Stack) -> None:
    reply = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "n": 128})
    assert reply.status_code == 200 and len(reply.json()["choices"]) == 128
    load = tiny_stack.engine_load()
    assert load.running_requests == 0 and load.waiting_requests == 0
