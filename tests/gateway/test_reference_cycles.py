"""A request leaves no reference cycle of the gateway's behind: what it built is freed by reference counting
when it ends, not by the garbage collector's passes, which walk everything still alive (a cycle made early in
a request has been promoted to an older generation by then, so only a full collection frees it)."""

from __future__ import annotations

import contextlib
import gc
import types
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import FakeRouter


@contextlib.contextmanager
def garbage_made() -> Iterator[list[Any]]:
    """The cyclic garbage made while the block runs (the collector is off meanwhile)."""
    gc.collect()
    gc.disable()
    found: list[Any] = []
    try:
        yield found
    finally:
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            gc.collect()
            found.extend(gc.garbage)
            gc.garbage.clear()
        finally:
            gc.set_debug(0)
            gc.enable()


def _gateways(garbage: list[Any]) -> list[str]:
    """What in `garbage` is the gateway's: instances of its classes and frames of its code."""
    ours = []
    for thing in garbage:
        if isinstance(thing, types.FrameType):
            if "/gateway/" in thing.f_code.co_filename:
                ours.append(f"frame {thing.f_code.co_qualname}")
        elif type(thing).__module__.startswith("gateway."):
            ours.append(type(thing).__qualname__)
    return sorted(set(ours))


BODIES = {
    "completions, streamed": ("/v1/completions", {"model": "tiny", "prompt": "hi", "stream": True}),
    "completions": ("/v1/completions", {"model": "tiny", "prompt": "hi"}),
    "chat, streamed": (
        "/v1/chat/completions",
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True},
    ),
    "generate, streamed": ("/generate", {"text": "hi", "stream": True}),
}


@pytest.mark.parametrize("kind", list(BODIES))
async def test_a_request_leaves_no_cycle_of_the_gateways(live_gateway: str, fake_router: FakeRouter, kind: str) -> None:
    path, body = BODIES[kind]
    async with httpx.AsyncClient(base_url=live_gateway, timeout=30) as client:
        assert (await client.post(path, json=body)).status_code == 200  # warm: connections, imports
        with garbage_made() as garbage:
            for _ in range(3):
                response = await client.post(path, json=body)
                assert response.status_code == 200, response.text
    assert _gateways(garbage) == []
