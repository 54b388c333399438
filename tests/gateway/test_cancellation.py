"""A client that goes away cancels the router call; deadlines answer 504. Real uvicorn, real sockets."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from gateway.config import GatewayConfig
from tests.gateway.conftest import FakeRouter, chunk

CANCEL_WAIT_S = 3.0


async def _forever(request, context):  # type: ignore[no-untyped-def]
    yield chunk(0, "tick", (1,), completion=1)
    await asyncio.Event().wait()  # never finishes on its own


STREAMS = {
    "/v1/completions": {"prompt": "x", "stream": True},
    "/generate": {"text": "x", "stream": True},
    "/v1/responses": {"input": "x", "stream": True},  # typed events, no [DONE]
}


@pytest.mark.parametrize("path", list(STREAMS))
async def test_stream_disconnect_cancels_the_call(
    live_gateway: str, fake_router: FakeRouter, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    fake_router.script = _forever
    body = STREAMS[path]
    async with (
        httpx.AsyncClient(base_url=live_gateway) as client,
        client.stream("POST", path, json=body) as response,
    ):
        assert response.status_code == 200
        lines = response.aiter_lines()
        assert (await anext(lines)).startswith(("data: {", "event: "))
        assert not fake_router.cancelled.is_set()
    # Leaving the block closed the connection mid-stream.
    await asyncio.wait_for(fake_router.cancelled.wait(), CANCEL_WAIT_S)
    await asyncio.sleep(0.1)  # the stream's own task ends after the cancel
    # The stream stopped quietly: the request ended normally (uvicorn logs an error for one that ends
    # cancelled), and no warning of a failed router call (the calls were cancelled by us).
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


NON_STREAMS = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "x"}]},
    "/v1/completions": {"prompt": "x"},
    "/generate": {"text": "x"},
    "/v1/responses": {"input": "x"},
}


@pytest.mark.parametrize("path", list(NON_STREAMS))
async def test_non_stream_disconnect_cancels_the_call(
    live_gateway: str, fake_router: FakeRouter, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    fake_router.script = _forever
    async with httpx.AsyncClient(base_url=live_gateway, timeout=httpx.Timeout(5.0, read=0.5)) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post(path, json=NON_STREAMS[path])
    assert len(fake_router.requests) == 1
    await asyncio.wait_for(fake_router.cancelled.wait(), CANCEL_WAIT_S)
    await asyncio.sleep(0.1)  # the request's own task ends after the cancel
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


async def test_stream_that_completes_answers_normally_over_sockets(live_gateway: str) -> None:
    async with httpx.AsyncClient(base_url=live_gateway) as client:
        response = await client.post("/v1/completions", json={"prompt": "x", "stream": True})
    assert response.text.endswith("data: [DONE]\n\n")


async def test_request_timeout_is_504(
    fake_router: FakeRouter, make_client: Callable[[GatewayConfig], AsyncIterator[httpx.AsyncClient]]
) -> None:
    fake_router.script = _forever
    config = GatewayConfig(router_address=fake_router.address, request_timeout_s=0.3)
    async for client in make_client(config):
        response = await client.post("/v1/completions", json={"prompt": "x"})
        assert response.status_code == 504
        assert response.json()["error"]["type"] == "timeout_error"
