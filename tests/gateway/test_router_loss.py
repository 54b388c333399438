"""A router that dies between the gateway's check of the channel (`RouterClient.connected`) and the
call: a call that fails UNAVAILABLE before any response waits for the router and is tried once
more; a router that stays down is a 503 naming it, never gRPC's socket text ("failed to connect
to all addresses ... Connection refused")."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import httpx
import pytest
from grpc import aio

from gateway.errors import HTTPError
from gateway.router_client import RouterClient
from tests.gateway.conftest import FakeRouter, chunk, default_script
from turnout.child_processes import free_port
from turnout.grpc_server import client_channel
from turnout.v1 import inference_pb2, inference_pb2_grpc, router_admin_pb2_grpc

Use = Callable[[RouterClient], Awaitable[Any]]


async def _generate(client: RouterClient) -> Any:
    generation = await client.generate([inference_pb2.GenerateRequest(request_id="r")])
    return (await generation.collect())[0].text


async def _list_engines(client: RouterClient) -> Any:
    return [e.address for e in (await client.list_engines()).engines]


# One per kind of call the gateway makes: the stream, the plain and the admin service's calls.
USES: dict[str, tuple[Use, Any]] = {
    "generate": (_generate, "Hello world"),
    "tokenize": (lambda client: client.tokenize("", "ab", False), [197, 198]),
    "list_models": (lambda client: client.list_models(), [FakeRouter().models[0]]),
    "list_engines": (_list_engines, ["10.0.0.5:50051"]),
}


async def serve(fake: FakeRouter, port: int) -> aio.Server:
    server = aio.server()
    inference_pb2_grpc.add_InferenceServicer_to_server(fake, server)
    router_admin_pb2_grpc.add_RouterAdminServicer_to_server(fake.admin, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server


class DyingRouter:
    """A fake router that `RouterClient.connected` kills right after its first check found it up
    (the race: the call then goes to a dead router), and, with `comes_back`, starts again on the same
    port when the client next checks (and, with `dies_again`, is killed again right after that check)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, comes_back: bool, dies_again: bool = False) -> None:
        self.fake = FakeRouter()
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.server: aio.Server | None = None
        self.checks = 0
        check = RouterClient.connected

        async def connected(client: RouterClient, timeout_s: float | None = None) -> None:
            self.checks += 1
            if self.checks == 2 and comes_back:
                self.server = await serve(self.fake, self.port)
            await check(client, timeout_s)
            if self.checks == 1 or (self.checks == 2 and dies_again):
                assert self.server is not None
                await self.server.stop(0)
                self.server = None

        monkeypatch.setattr(RouterClient, "connected", connected)

    async def start(self) -> None:
        self.server = await serve(self.fake, self.port)

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)


@pytest.fixture
async def channels() -> AsyncIterator[list[aio.Channel]]:
    opened: list[aio.Channel] = []
    yield opened
    for channel in opened:
        await channel.close()


def client_of(router: DyingRouter, channels: list[aio.Channel], ready_timeout_s: float) -> RouterClient:
    channel = client_channel(router.address)
    channels.append(channel)
    return RouterClient.on_channel(channel, 10.0, address=router.address, ready_timeout_s=ready_timeout_s)


@pytest.mark.parametrize("use", USES, ids=list(USES))
async def test_a_call_to_a_router_that_died_after_the_check_is_tried_again_once_it_is_back(
    monkeypatch: pytest.MonkeyPatch, channels: list[aio.Channel], use: str
) -> None:
    router = DyingRouter(monkeypatch, comes_back=True)
    await router.start()
    try:
        call, expected = USES[use]
        assert await call(client_of(router, channels, ready_timeout_s=30)) == expected
        assert router.checks == 2  # one more try, after waiting for the router again
        if use == "generate":
            assert len(router.fake.requests) == 1  # the first call never reached a router
    finally:
        await router.stop()


@pytest.mark.parametrize("use", USES, ids=list(USES))
async def test_a_router_that_died_after_the_check_and_stays_down_is_named_not_its_socket(
    monkeypatch: pytest.MonkeyPatch, channels: list[aio.Channel], use: str
) -> None:
    router = DyingRouter(monkeypatch, comes_back=False)
    await router.start()
    try:
        with pytest.raises(HTTPError) as refused:
            await USES[use][0](client_of(router, channels, ready_timeout_s=0.5))
        assert refused.value.status == 503
        assert refused.value.message.startswith(f"the router at {router.address} is not reachable (restarting?); ")
        assert router.checks == 2  # tried once more, not in a loop
    finally:
        await router.stop()


async def test_a_router_that_dies_again_after_coming_back_is_named_not_its_socket(
    monkeypatch: pytest.MonkeyPatch, channels: list[aio.Channel]
) -> None:
    router = DyingRouter(monkeypatch, comes_back=True, dies_again=True)
    await router.start()
    try:
        with pytest.raises(HTTPError) as refused:
            await _generate(client_of(router, channels, ready_timeout_s=30))
        assert refused.value.status == 503
        assert refused.value.message == (
            f"the router at {router.address} is not reachable (restarting?); it dropped the call again after "
            "coming back"
        )
        assert router.checks == 2
    finally:
        await router.stop()


async def test_a_probe_neither_waits_nor_tries_again(
    monkeypatch: pytest.MonkeyPatch, channels: list[aio.Channel]
) -> None:
    router = DyingRouter(monkeypatch, comes_back=True)
    await router.start()
    try:
        with pytest.raises(aio.AioRpcError) as failed:
            await client_of(router, channels, ready_timeout_s=30).probing().list_models()
        assert failed.value.code() is grpc.StatusCode.UNAVAILABLE
        assert router.checks == 1
    finally:
        await router.stop()


def failing_first(times: int, *, after_output: bool = False) -> Any:
    """A Generate script whose first `times` calls fail UNAVAILABLE (after one chunk with
    `after_output`), the others answer as the default script."""
    left = [times]

    async def script(request: Any, context: Any) -> AsyncIterator[Any]:
        if left[0] > 0:
            left[0] -= 1
            if after_output:
                yield chunk(0, "Hel", (11,), completion=1)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "no healthy engine is serving 'tiny'")
        async for response in default_script(request, context):
            yield response

    return script


async def test_generate_failing_unavailable_before_output_is_tried_once_more(
    fake_router: FakeRouter, client: httpx.AsyncClient
) -> None:
    fake_router.script = failing_first(1)
    reply = await client.post("/v1/completions", json={"model": "tiny", "prompt": "hi"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["text"] == "Hello world"
    assert len(fake_router.requests) == 2


async def test_the_routers_own_unavailable_twice_is_shown_in_its_words(
    fake_router: FakeRouter, client: httpx.AsyncClient
) -> None:
    fake_router.script = failing_first(2)
    reply = await client.post("/v1/completions", json={"model": "tiny", "prompt": "hi"})
    assert reply.status_code == 503
    assert reply.json()["error"]["message"] == "no healthy engine is serving 'tiny'"
    assert len(fake_router.requests) == 2


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_generate_failing_after_output_began_is_not_tried_again(
    fake_router: FakeRouter, client: httpx.AsyncClient, stream: bool
) -> None:
    fake_router.script = failing_first(1, after_output=True)
    reply = await client.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "stream": stream})
    if stream:
        assert "no healthy engine is serving 'tiny'" in reply.text
        assert "Hello world" not in reply.text
    else:
        assert reply.status_code == 503
        assert reply.json()["error"]["message"] == "no healthy engine is serving 'tiny'"
    assert len(fake_router.requests) == 1
