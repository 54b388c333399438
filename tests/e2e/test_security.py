"""Authentication against the real services: every RPC of the engine (tiny model), tokenizer and
router refuses a caller without credentials; what the API key, the internal token and the admin
key each allow; a service without a token refuses to start; and `turnout serve` with its generated
token, keys on HTTP and public gRPC alike, and TLS on every hop."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import psutil
import pytest
from grpc import aio
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.credentials import ADMIN, INTERNAL, TEST_ADMIN_KEY
from tests.e2e.services import Service
from tests.e2e.stack import ROOT, start_stack
from tests.grpc_methods import Rpc, call, rpcs, standard_services, turnout_services
from tests.test_security import make_ca
from turnout.client import Client, TurnoutError
from turnout.grpc_auth import ADMIN_METHODS, Access, required_access, sync_channel
from turnout.grpc_server import client_channel
from turnout.security import API_KEY_ENV, INTERNAL_TOKEN_ENV, ClientCredentials
from turnout.v1 import (
    common_pb2,
    engine_pb2,
    engine_pb2_grpc,
    inference_pb2,
    inference_pb2_grpc,
    router_admin_pb2,
    router_admin_pb2_grpc,
)

API_KEY = "e2e-api-key"
UNAUTHENTICATED, DENIED = grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED
# Which process serves each Turnout service; a new service must be placed here to pass.
SERVED_BY = {
    "turnout.v1.Engine": ("engine",),
    "turnout.v1.Tokenizer": ("tokenizer",),
    "turnout.v1.Inference": ("router",),
    "turnout.v1.RouterAdmin": ("router",),
    "turnout.v1.Metrics": ("engine", "tokenizer", "router"),  # each serves its page (the router all of them)
}


@dataclass
class Services:
    engine: Service
    tokenizer: Service
    router: Service

    def address(self, name: str) -> str:
        service: Service = getattr(self, name)
        return service.address


@pytest.fixture(scope="module")
def services(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    """The three gRPC services as processes, with the suite's token and admin key (tests/conftest.py)
    and an API key on the router."""
    logs = tmp_path_factory.mktemp("security-logs")
    engine = Service("engine", ["engine", "--model", str(tiny_model_dir), "--num-kv-blocks", "64"], logs / "e.log")
    tokenizer = Service("tokenizer", ["tokenizer", "--model", str(tiny_model_dir)], logs / "t.log")
    started = [engine.start(), tokenizer.start()]
    try:
        engine.wait_healthy(180)
        tokenizer.wait_healthy()
        args = ["router", "--engine", engine.address, "--tokenizer", tokenizer.address, "--api-key", API_KEY]
        router = Service("router", args, logs / "r.log").start()
        started.append(router)
        router.wait_healthy()
        yield Services(engine, tokenizer, router)
    finally:
        for service in started:
            service.stop()


def served_rpcs(name: str) -> list[Rpc]:
    services = [s for s in turnout_services() if name in SERVED_BY[s.full_name]]
    return [rpc for service in [*services, *standard_services()] for rpc in rpcs(service)]


async def listed_services(address: str) -> set[str]:
    async with client_channel(address, INTERNAL) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        async for reply in stub.ServerReflectionInfo(iter([request]), timeout=10):
            return {s.name for s in reply.list_services_response.service}
    raise AssertionError("no reflection reply")


async def test_every_rpc_of_every_service_needs_a_credential(services: Services) -> None:
    assert set(SERVED_BY) == {s.full_name for s in turnout_services()}, "place the new service in SERVED_BY"
    for name in ("engine", "tokenizer", "router"):
        address = services.address(name)
        # What the server mounts is what this test walks: nothing served escapes it.
        walked = {rpc.service for rpc in served_rpcs(name)}
        assert await listed_services(address) == walked, name
        async with client_channel(address) as channel:
            for rpc in served_rpcs(name):
                code = await call(channel, rpc)
                needed = required_access(rpc.path)
                if needed is Access.OPEN or (needed is Access.PUBLIC and name != "router"):  # no API key there
                    assert code is not UNAUTHENTICATED, rpc.path
                else:
                    assert code is UNAUTHENTICATED, (rpc.path, code)
                assert await call(channel, rpc, (("authorization", "Bearer guessed"),)) is not DENIED


async def test_admin_rpcs_need_the_admin_key(services: Services) -> None:
    for name in ("engine", "router"):
        async with client_channel(services.address(name), INTERNAL) as channel:
            for rpc in served_rpcs(name):
                if rpc.path in ADMIN_METHODS:
                    assert await call(channel, rpc) is DENIED, rpc.path
    # The router's flush reaches the engine with the caller's admin key, and only with it.
    async with client_channel(services.router.address, ADMIN) as channel:
        stub = router_admin_pb2_grpc.RouterAdminStub(channel)
        reply = await stub.FlushCache(engine_pb2.FlushCacheRequest(), timeout=30)
        assert [(e.address, e.flushed) for e in reply.engines] == [(services.engine.address, True)], reply
        listed = await stub.ListEngines(router_admin_pb2.ListEnginesRequest(), timeout=10)
        assert [e.address for e in listed.engines] == [services.engine.address]
    async with client_channel(services.engine.address, ADMIN) as channel:
        aborted = await engine_pb2_grpc.EngineStub(channel).Abort(engine_pb2.AbortRequest(request_id="x"), timeout=10)
        assert aborted is not None


def generate_request() -> inference_pb2.GenerateRequest:
    params = common_pb2.SamplingParams(max_new_tokens=2, temperature=0, ignore_eos=True)
    return inference_pb2.GenerateRequest(input_ids=common_pb2.TokenIds(ids=[1000, 2000, 3000]), sampling_params=params)


async def test_the_api_key_opens_the_public_service_only(services: Services) -> None:
    async with client_channel(services.router.address, ClientCredentials(bearer=API_KEY)) as channel:
        responses = [
            r async for r in inference_pb2_grpc.InferenceStub(channel).Generate(generate_request(), timeout=60)
        ]
        assert responses[-1].complete.usage.completion_tokens == 2
        remove = channel.unary_unary("/turnout.v1.RouterAdmin/RemoveEngine")
        with pytest.raises(aio.AioRpcError) as refused:
            await remove(b"", timeout=10)
        assert refused.value.code() is DENIED
    async with client_channel(services.engine.address, ClientCredentials(bearer=API_KEY)) as channel:
        assert await call(channel, next(r for r in served_rpcs("engine") if r.descriptor.name == "GetLoad")) is (
            UNAUTHENTICATED  # the engine knows no API key
        )
    # The typed client takes the key; without it the router refuses.
    with Client(services.router.address, timeout_s=60, api_key=API_KEY) as client:
        [done] = client.generate([1000, 2000], max_new_tokens=2, temperature=0.0, ignore_eos=True)
        assert done.completion_tokens == 2
    with Client(services.router.address, timeout_s=60) as client, pytest.raises(TurnoutError, match="API key"):
        client.generate([1000, 2000], max_new_tokens=2)


def test_a_service_without_a_token_refuses_to_start(tiny_model_dir: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != INTERNAL_TOKEN_ENV}
    argv = [sys.executable, "-m", "turnout.cli", "tokenizer", "--model", str(tiny_model_dir), "--port", "0"]
    refused = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0
    assert "no internal token" in refused.stderr and "--insecure-internal" in refused.stderr


# -- `turnout serve` --------------------------------------------------------------


def children_environments(launcher: int) -> list[tuple[list[str], dict[str, str]]]:
    return [(child.cmdline(), child.environ()) for child in psutil.Process(launcher).children()]


def test_turnout_serve_secures_every_hop(tiny_model_dir: Path, tmp_path: Path) -> None:
    keys = ("--api-key", API_KEY, "--admin-key", "stack-admin-key")
    stack = start_stack(tiny_model_dir, tmp_path / "stack.log", *keys)
    try:
        # One generated token for all four children, through the environment only.
        children = children_environments(stack.process.pid)
        assert len(children) == 4
        tokens = {env.get(INTERNAL_TOKEN_ENV) for _, env in children}
        assert len(tokens) == 1
        [token] = tokens
        assert token and len(token) >= 32 and token != INTERNAL.bearer
        assert all(env[API_KEY_ENV] == API_KEY for _, env in children)
        for argv, _ in children:
            assert not {token, API_KEY, "stack-admin-key"} & set(" ".join(argv).split()), argv

        # HTTP and the router's public gRPC take the same API key.
        body = {"prompt": "Hi", "max_tokens": 2}
        assert httpx.post(f"{stack.base_url}/v1/completions", json=body, timeout=60).status_code == 401
        auth = {"Authorization": f"Bearer {API_KEY}"}
        assert httpx.post(f"{stack.base_url}/v1/completions", json=body, headers=auth, timeout=60).status_code == 200
        router = f"127.0.0.1:{stack.router_port}"
        with Client(router, timeout_s=60, api_key=API_KEY) as client:
            assert client.generate("Hi", max_new_tokens=2, ignore_eos=True)[0].completion_tokens == 2

        # The engine answers the stack's token, not the suite's, and not nothing.
        engine = f"127.0.0.1:{stack.engine_port}"
        for credentials, works in ((None, False), (INTERNAL, False), (ClientCredentials(bearer=token), True)):
            with sync_channel(engine, credentials, []) as channel:
                try:
                    engine_pb2_grpc.EngineStub(channel).GetLoad(engine_pb2.GetLoadRequest(), timeout=10)
                    assert works
                except grpc.RpcError as exc:
                    assert not works and exc.code() is UNAUTHENTICATED

        # The admin route takes the stack's admin key (not the suite's, not the API key).
        for key, status in ((API_KEY, 401), (TEST_ADMIN_KEY, 401), ("stack-admin-key", 200)):
            flushed = httpx.post(
                f"{stack.base_url}/flush_cache", headers={"Authorization": f"Bearer {key}"}, timeout=30
            )
            assert flushed.status_code == status, (key, flushed.text)
    finally:
        stack.stop()


def test_turnout_serve_over_mutual_tls(tiny_model_dir: Path, tmp_path: Path) -> None:
    files = make_ca(tmp_path, ("server",))["server"]
    assert files.certfile and files.keyfile and files.ca_certs
    flags = ["--ssl-certfile", str(files.certfile), "--ssl-keyfile", str(files.keyfile)]
    flags += ["--ssl-ca-certs", str(files.ca_certs)]
    stack = start_stack(tiny_model_dir, tmp_path / "tls-stack.log", *flags, https_ca=files.ca_certs)
    try:
        verify = ssl.create_default_context(cafile=files.ca_certs)
        reply = httpx.get(f"https://127.0.0.1:{stack.port}/health", verify=verify, timeout=10)
        assert reply.status_code == 200
        router = f"127.0.0.1:{stack.router_port}"
        # A client whose CA did not sign the router's certificate, and the router not its own.
        stranger = make_ca(tmp_path / "other", ("x",))["x"]
        with Client(router, timeout_s=60, tls=stranger) as client, pytest.raises(TurnoutError):
            client.generate("Hi", max_new_tokens=1)
        with Client(router, timeout_s=60) as plaintext, pytest.raises(TurnoutError):
            plaintext.generate("Hi", max_new_tokens=1)
        with Client(router, timeout_s=60, tls=files) as client:
            assert client.generate("Hi", max_new_tokens=2, ignore_eos=True)[0].completion_tokens == 2
    finally:
        stack.stop()
