"""A tokenizer that dies between the router's pick and the call: the request is tried once more on
a newly picked replica when nothing was sent yet, else it fails UNAVAILABLE naming the tokenizer,
never with gRPC's socket text ("failed to connect ... Connection refused")."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
from grpc import aio

from tests.router.conftest import FakeTokenizer, text_of
from turnout.errors import Unavailable
from turnout.v1 import inference_pb2

SOCKET_TEXT = "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Connection refused"


class VanishingTokenizer(FakeTokenizer):
    """Answers its first `encode_failures` Encodes and `detokenize_failures` Detokenize streams
    as a dead replica's channel would."""

    def __init__(self, encode_failures: int = 0, detokenize_failures: int = 0) -> None:
        super().__init__()
        self.encode_failures = encode_failures
        self.detokenize_failures = detokenize_failures
        self.encodes = 0

    async def Encode(self, request: Any, context: Any) -> Any:
        self.encodes += 1
        if self.encode_failures > 0:
            self.encode_failures -= 1
            raise Unavailable(SOCKET_TEXT)  # the status its call ends with, carried or not
        return await super().Encode(request, context)

    async def Detokenize(self, request_iterator: Any, context: Any) -> AsyncIterator[Any]:
        if self.detokenize_failures > 0:
            self.detokenize_failures -= 1
            raise Unavailable(SOCKET_TEXT)  # the status its call ends with, carried or not
        async for response in super().Detokenize(request_iterator, context):
            yield response


@pytest.mark.parametrize(
    "tokenizer",
    [VanishingTokenizer(encode_failures=1), VanishingTokenizer(detokenize_failures=1)],
    ids=["encode", "detokenize-start"],
)
async def test_a_tokenizer_lost_before_output_costs_one_more_try(
    make_cluster: Callable[..., Any], tokenizer: VanishingTokenizer
) -> None:
    cluster = await make_cluster(1, tokenizer_servicer=tokenizer, tokenizer_ready_timeout_s=2.0)
    responses = await cluster.generate("hi", max_new_tokens=3)
    assert text_of(responses) == "<100><101><102>"
    assert tokenizer.encodes == 2


async def test_a_tokenizer_lost_twice_is_named_not_its_socket(make_cluster: Callable[..., Any]) -> None:
    tokenizer = VanishingTokenizer(encode_failures=10)
    cluster = await make_cluster(1, tokenizer_servicer=tokenizer, tokenizer_ready_timeout_s=2.0)
    with pytest.raises(aio.AioRpcError) as failed:
        await cluster.generate("hi", max_new_tokens=3)
    assert failed.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "the tokenizer (127.0.0.1:" in failed.value.details()
    assert "went away during the request" in failed.value.details()
    assert "connection refused" not in failed.value.details().lower()
    assert tokenizer.encodes == 2  # one retry, not a loop


async def test_tokenize_is_retried_on_a_new_pick(make_cluster: Callable[..., Any]) -> None:
    tokenizer = VanishingTokenizer(encode_failures=1)
    cluster = await make_cluster(1, tokenizer_servicer=tokenizer, tokenizer_ready_timeout_s=2.0)
    reply = await cluster.inference.Tokenize(inference_pb2.TokenizeRequest(text="abc"))
    assert list(reply.input_ids) == [97, 98, 99]
