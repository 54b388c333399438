"""Invalid UTF-8 in a protobuf string field is INVALID_ARGUMENT naming the field (grpc said UNKNOWN)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from grpc import aio

from turnout.grpc_server import make_server
from turnout.request_decoding import invalid_utf8_field
from turnout.v1 import common_pb2, inference_pb2, inference_pb2_grpc, tokenizer_pb2, tokenizer_pb2_grpc

SURROGATE = "\ud800".encode("utf-8", "surrogatepass")  # b"\xed\xa0\x80": never valid UTF-8


def corrupt(message: object, marker: str) -> bytes:
    """The message's bytes with `marker` (3 ASCII characters) replaced by a UTF-8-encoded surrogate."""
    data: bytes = message.SerializeToString()  # type: ignore[attr-defined]
    assert len(marker) == len(SURROGATE) and data.count(marker.encode()) == 1
    return data.replace(marker.encode(), SURROGATE)


GENERATE_CASES = [
    (inference_pb2.GenerateRequest(text="@@@"), "text"),
    (inference_pb2.GenerateRequest(request_id="@@@"), "request_id"),
    (
        inference_pb2.GenerateRequest(sampling_params=common_pb2.SamplingParams(stop=["ok", "@@@"])),
        "sampling_params.stop[1]",
    ),
    (
        inference_pb2.GenerateRequest(
            chat=common_pb2.ChatInput(
                messages=[common_pb2.ChatMessage(role="user", content="hi"), common_pb2.ChatMessage(content="@@@")]
            )
        ),
        "chat.messages[1].content",
    ),
]


@pytest.mark.parametrize(("message", "field"), GENERATE_CASES)
def test_the_walk_names_the_field(message: object, field: str) -> None:
    descriptor = inference_pb2.GenerateRequest.DESCRIPTOR
    assert invalid_utf8_field(descriptor, corrupt(message, "@@@")) == field
    assert invalid_utf8_field(descriptor, message.SerializeToString()) is None  # type: ignore[attr-defined]


class _Inference(inference_pb2_grpc.InferenceServicer):
    async def Tokenize(self, request: object, context: aio.ServicerContext) -> inference_pb2.TokenizeResponse:
        return inference_pb2.TokenizeResponse(input_ids=[1])

    async def Generate(
        self, request: object, context: aio.ServicerContext
    ) -> AsyncIterator[inference_pb2.GenerateResponse]:
        yield inference_pb2.GenerateResponse()


class _Tokenizer(tokenizer_pb2_grpc.TokenizerServicer):
    async def Detokenize(
        self, requests: AsyncIterator[tokenizer_pb2.DetokenizeRequest], context: aio.ServicerContext
    ) -> AsyncIterator[tokenizer_pb2.DetokenizeResponse]:
        async for _ in requests:
            yield tokenizer_pb2.DetokenizeResponse()


@pytest.fixture
async def channel() -> AsyncIterator[aio.Channel]:
    server = make_server("test")
    inference_pb2_grpc.add_InferenceServicer_to_server(_Inference(), server)
    tokenizer_pb2_grpc.add_TokenizerServicer_to_server(_Tokenizer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        yield ch
    await server.stop(0)


async def test_unary_stream_and_unary_calls_get_invalid_argument(channel: aio.Channel) -> None:
    generate = channel.unary_stream("/turnout.v1.Inference/Generate")
    with pytest.raises(aio.AioRpcError) as info:
        async for _ in generate(corrupt(inference_pb2.GenerateRequest(text="@@@"), "@@@")):
            pass
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == "'text' is not valid UTF-8 text (string fields must be UTF-8, without surrogates)"

    tokenize = channel.unary_unary("/turnout.v1.Inference/Tokenize")
    with pytest.raises(aio.AioRpcError) as info:
        await tokenize(corrupt(inference_pb2.TokenizeRequest(model="@@@"), "@@@"))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'model'" in (info.value.details() or "")
    # A good request still works.
    assert await tokenize(inference_pb2.TokenizeRequest(text="hi").SerializeToString())


async def test_a_stream_of_requests_gets_invalid_argument_at_the_bad_one(channel: aio.Channel) -> None:
    call = channel.stream_stream("/turnout.v1.Tokenizer/Detokenize")()
    start = tokenizer_pb2.DetokenizeRequest(start=tokenizer_pb2.DetokenizeStart(request_id="ok"))
    await call.write(start.SerializeToString())
    assert await call.read() == b""
    bad = tokenizer_pb2.DetokenizeRequest(start=tokenizer_pb2.DetokenizeStart(stop=["@@@"]))
    await call.write(corrupt(bad, "@@@"))
    with pytest.raises(aio.AioRpcError) as info:
        await call.read()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'start.stop[0]'" in (info.value.details() or "")
