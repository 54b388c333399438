"""--max-client-batch-size: a batch over the limit is a 400 naming the field, the limit and the flag."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from gateway.batch_limit import BATCH_FANOUT, gather_bounded
from gateway.config import GatewayConfig
from gateway.main import config_from_args, parse_args
from tests.gateway.conftest import FakeRouter

CASES = [
    ("/v1/completions", {"prompt": ["hi"] * 4, "max_tokens": 1}, "prompt"),
    ("/generate", {"text": ["hi"] * 4}, "text"),
    ("/generate", {"input_ids": [[1, 2]] * 4}, "input_ids"),
    ("/tokenize", {"prompt": ["hi"] * 4}, "prompt"),
    ("/detokenize", {"tokens": [[1, 200]] * 4}, "tokens"),
]


@pytest.mark.parametrize(("route", "body", "param"), CASES)
async def test_a_batch_over_the_limit_is_refused_before_any_router_call(
    fake_router: FakeRouter, make_client: Callable[[GatewayConfig], Any], route: str, body: dict[str, Any], param: str
) -> None:
    async for client in make_client(GatewayConfig(router_address=fake_router.address, max_client_batch_size=3)):
        reply = await client.post(route, json=body)
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["param"] == param
        assert "4 entries" in error["message"] and "limit of 3" in error["message"]
        assert "--max-client-batch-size" in error["message"]
        assert fake_router.requests == [] and fake_router.tokenize_requests == []
        assert fake_router.detokenize_requests == []
        # At the limit it is served.
        at_limit = {k: v[:3] if isinstance(v, list) else v for k, v in body.items()}
        assert (await client.post(route, json=at_limit)).status_code == 200


def test_the_flag_sets_the_limit_and_defaults_to_1024() -> None:
    assert config_from_args(parse_args(["--router", "x:1"])).max_client_batch_size == 1024
    assert config_from_args(parse_args(["--router", "x:1", "--max-client-batch-size", "8"])).max_client_batch_size == 8
    with pytest.raises(ValueError, match="max_client_batch_size"):
        GatewayConfig(router_address="x:1", max_client_batch_size=0)


def test_turnout_serve_forwards_the_limit_to_the_gateway() -> None:
    from pathlib import Path

    from turnout import launcher

    argv = ["--model", "/m", "--max-client-batch-size", "7"]
    stack = launcher.build_stack(launcher.build_parser().parse_args(argv), Path("/m"))
    gateway = stack.children[-1]
    config = config_from_args(parse_args(gateway.argv[gateway.argv.index("gateway") + 1 :]))
    assert config.max_client_batch_size == 7


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/tokenize", {"prompt": ["hi"] * 64}),
        ("/detokenize", {"tokens": [[1, 200]] * 64}),
        ("/v1/completions", {"prompt": [[1, 200]] * 64, "max_tokens": 1, "echo": True}),
    ],
)
async def test_a_batch_sends_its_tokenizer_calls_a_few_at_a_time(
    fake_router: FakeRouter, make_client: Callable[[GatewayConfig], Any], route: str, body: dict[str, Any]
) -> None:
    """A 64-prompt batch keeps at most BATCH_FANOUT tokenizer calls in flight (it sent all 64 at
    once before), so another client's request never waits behind a whole batch's calls."""
    fake_router.tokenizer_delay_s = 0.01
    async for client in make_client(GatewayConfig(router_address=fake_router.address)):
        reply = await client.post(route, json=body)
        assert reply.status_code == 200, reply.text
        assert len(fake_router.tokenize_requests) + len(fake_router.detokenize_requests) >= 64
        assert 1 < fake_router.most_tokenizer_calls_in_flight <= BATCH_FANOUT


async def test_gather_bounded_keeps_order_and_its_limit() -> None:
    in_flight = most = 0

    async def call(i: int) -> int:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.001 * (i % 3))
        in_flight -= 1
        return i

    assert await gather_bounded((call(i) for i in range(50)), limit=4) == list(range(50))
    assert most == 4
    assert await gather_bounded([]) == []


async def test_gather_bounded_raises_the_first_failure_and_starts_nothing_after_it() -> None:
    started: list[int] = []

    async def call(i: int) -> int:
        started.append(i)
        await asyncio.sleep(0)
        if i == 2:
            raise ValueError("prompt 2 is bad")
        await asyncio.sleep(1)
        return i

    with pytest.raises(ValueError, match="prompt 2"):
        await gather_bounded((call(i) for i in range(100)), limit=3)
    assert len(started) < 10
