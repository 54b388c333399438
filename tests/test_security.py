"""Authentication on gRPC, in process: every method of every service behind the one interceptor,
what each credential allows, TLS and mutual TLS, and where the settings come from.

The servers here mount the generated base servicers (every handler answers UNIMPLEMENTED), so a
call the interceptor lets through ends UNIMPLEMENTED and one it refuses ends with its refusal.
tests/e2e/test_security.py does the same against the real services.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import ipaddress
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc import aio
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from tests.grpc_methods import Rpc, call, rpcs, standard_services, turnout_services
from turnout.grpc_auth import ADMIN_METHODS, Access, required_access
from turnout.grpc_server import client_channel, make_server
from turnout.security import (
    ADMIN_KEY_ENV,
    API_KEY_ENV,
    INTERNAL_TOKEN_ENV,
    ClientCredentials,
    ServiceSecurity,
    TlsFiles,
    add_security_flags,
    stack_environment,
)

TOKEN, API_KEY, ADMIN_KEY = "internal-token", "api-key", "admin-key"
SECURITY = ServiceSecurity(internal_token=TOKEN, api_keys=(API_KEY,), admin_key=ADMIN_KEY)
UNIMPLEMENTED, UNAUTHENTICATED, DENIED = (
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
)

Serve = Callable[..., Awaitable[str]]


def let_through(code: grpc.StatusCode) -> bool:
    """The interceptor passed the call on (the base servicer then fails it one way or another)."""
    return code not in (UNAUTHENTICATED, DENIED)


def bearer(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


@pytest.fixture
async def serve_all() -> AsyncIterator[Serve]:
    """`await serve_all(security, tls=None)`: one server with every Turnout service (base servicers),
    health and reflection behind `make_server`'s interceptors; returns its address."""
    servers: list[aio.Server] = []

    async def start(security: ServiceSecurity | None, tls: TlsFiles | None = None) -> str:
        server = make_server("test", security=security)
        names = []
        for service in turnout_services():
            # turnout/v1/engine.proto -> turnout.v1.engine_pb2_grpc
            module = importlib.import_module(service.file.name.removesuffix(".proto").replace("/", ".") + "_pb2_grpc")
            servicer = getattr(module, f"{service.name}Servicer")()
            getattr(module, f"add_{service.name}Servicer_to_server")(servicer, server)
            names.append(service.full_name)
        health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
        reflection.enable_server_reflection([*names, reflection.SERVICE_NAME], server)
        if tls is not None:
            port = server.add_secure_port("127.0.0.1:0", tls.server_credentials())
        else:
            port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for server in servers:
        await server.stop(0)


def every_rpc() -> list[Rpc]:
    return [rpc for service in [*turnout_services(), *standard_services()] for rpc in rpcs(service)]


def test_the_access_table_names_real_methods() -> None:
    paths = {rpc.path for rpc in every_rpc()}
    assert paths >= ADMIN_METHODS, ADMIN_METHODS - paths
    assert required_access("/turnout.v1.Inference/Generate") is Access.PUBLIC
    assert required_access("/grpc.health.v1.Health/Check") is Access.OPEN
    assert required_access("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo") is Access.PUBLIC
    assert required_access("/turnout.v1.RouterAdmin/ListEngines") is Access.PUBLIC
    assert required_access("/turnout.v1.Engine/GetLoad") is Access.INTERNAL
    # A method nobody has classified yet needs the token.
    assert required_access("/turnout.v1.Engine/SomethingNew") is Access.INTERNAL


async def test_every_method_refuses_a_caller_without_credentials(serve_all: Serve) -> None:
    address = await serve_all(SECURITY)
    async with client_channel(address) as channel:
        for rpc in every_rpc():
            for metadata in ((), bearer("wrong"), (("authorization", f"Basic {TOKEN}"),)):
                code = await call(channel, rpc, metadata)
                if rpc.service == "grpc.health.v1.Health":  # open to probes
                    assert code is not UNAUTHENTICATED, rpc.path
                else:
                    assert code is UNAUTHENTICATED, (rpc.path, metadata, code)


async def test_what_each_credential_allows(serve_all: Serve) -> None:
    address = await serve_all(SECURITY)
    async with client_channel(address) as channel:
        for rpc in every_rpc():
            if rpc.service == "grpc.health.v1.Health":
                continue
            needed = required_access(rpc.path)
            for key, level in ((API_KEY, Access.PUBLIC), (TOKEN, Access.INTERNAL), (ADMIN_KEY, Access.ADMIN)):
                code = await call(channel, rpc, bearer(key))
                if level >= needed:
                    assert let_through(code), (rpc.path, key, code)
                else:
                    assert code is DENIED, (rpc.path, key, code)


async def test_channels_present_their_bearer_and_calls_may_override_it(serve_all: Serve) -> None:
    address = await serve_all(SECURITY)
    engine_abort = next(rpc for rpc in every_rpc() if rpc.path == "/turnout.v1.Engine/Abort")
    get_load = next(rpc for rpc in every_rpc() if rpc.path == "/turnout.v1.Engine/GetLoad")
    async with client_channel(address, ClientCredentials(bearer=TOKEN)) as channel:
        assert let_through(await call(channel, get_load))
        assert await call(channel, engine_abort) is DENIED
        # The router passes an admin caller's key on instead of its own token.
        assert let_through(await call(channel, engine_abort, bearer(ADMIN_KEY)))


async def test_without_an_admin_key_admin_rpcs_are_refused_to_everyone(serve_all: Serve) -> None:
    address = await serve_all(ServiceSecurity(internal_token=TOKEN))
    async with client_channel(address, ClientCredentials(bearer=TOKEN)) as channel:
        for rpc in every_rpc():
            if rpc.path in ADMIN_METHODS:
                code = await call(channel, rpc)
                assert code is DENIED, rpc.path
        with pytest.raises(aio.AioRpcError, match="no --admin-key is configured"):
            await channel.unary_unary("/turnout.v1.RouterAdmin/RemoveEngine")(b"", timeout=5)


async def test_without_api_keys_the_public_service_is_open(serve_all: Serve) -> None:
    address = await serve_all(ServiceSecurity(internal_token=TOKEN))
    generate = next(rpc for rpc in every_rpc() if rpc.path == "/turnout.v1.Inference/Generate")
    get_load = next(rpc for rpc in every_rpc() if rpc.path == "/turnout.v1.Engine/GetLoad")
    async with client_channel(address) as channel:
        assert let_through(await call(channel, generate))
        assert await call(channel, get_load) is UNAUTHENTICATED


async def test_insecure_internal_opens_internal_rpcs_only(serve_all: Serve) -> None:
    address = await serve_all(ServiceSecurity(api_keys=(API_KEY,), admin_key=ADMIN_KEY))
    by_path = {rpc.path: rpc for rpc in every_rpc()}
    async with client_channel(address) as channel:
        assert let_through(await call(channel, by_path["/turnout.v1.Engine/GetLoad"]))
        assert await call(channel, by_path["/turnout.v1.Inference/Generate"]) is UNAUTHENTICATED
        assert await call(channel, by_path["/turnout.v1.Engine/FlushCache"]) is UNAUTHENTICATED


# -- settings ---------------------------------------------------------------------


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_security_flags(parser)
    return parser.parse_args(argv)


def test_a_service_without_a_token_refuses_to_start_unless_insecure(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--insecure-internal"):
        ServiceSecurity.from_args(parse([]), env={})
    assert ServiceSecurity.from_args(parse(["--insecure-internal"]), env={}).internal_token is None
    env = {INTERNAL_TOKEN_ENV: "tok-1", API_KEY_ENV: "key-a\nkey-b", ADMIN_KEY_ENV: "adm-1"}
    security = ServiceSecurity.from_args(parse([]), env=env)
    assert (security.internal_token, security.api_keys, security.admin_key) == ("tok-1", ("key-a", "key-b"), "adm-1")
    assert not any(secret in repr(security) for secret in ("tok-1", "key-a", "adm-1"))
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    assert ServiceSecurity.from_args(parse(["--internal-token-file", str(token_file)]), env={}).internal_token == (
        "from-file"
    )
    with pytest.raises(ValueError, match="--internal-token-file"):
        ServiceSecurity.from_args(parse(["--internal-token-file", str(tmp_path / "missing")]), env={})


def test_turnout_serve_generates_a_fresh_token_per_start() -> None:
    first, second = stack_environment(parse([])), stack_environment(parse([]))
    assert len(first[INTERNAL_TOKEN_ENV]) >= 32 and first[INTERNAL_TOKEN_ENV] != second[INTERNAL_TOKEN_ENV]
    assert INTERNAL_TOKEN_ENV not in stack_environment(parse(["--insecure-internal"]))
    keyed = stack_environment(parse(["--api-key", "a", "--api-key", "b", "--admin-key", "adm"]))
    assert keyed[API_KEY_ENV] == "a\nb" and keyed[ADMIN_KEY_ENV] == "adm"


def test_the_launcher_puts_no_secret_on_a_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from turnout.launcher import build_parser, build_stack

    (tmp_path / "ca.pem").write_text("")
    argv = ["--api-key", "user-key", "--admin-key", "admin-key-x", "--ssl-ca-certs", str(tmp_path / "ca.pem")]
    args = build_parser().parse_args(argv)
    monkeypatch.setattr("turnout.launcher.free_port", lambda: 1)
    stack = build_stack(args, tmp_path)
    for child in stack.children:
        joined = " ".join(child.argv)
        assert "user-key" not in joined and "admin-key-x" not in joined
        assert f"--ssl-ca-certs {tmp_path / 'ca.pem'}" in joined, child.name


# -- TLS --------------------------------------------------------------------------


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_pem(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> tuple[Path, Path]:
    cert_path, key_path = path.with_suffix(".crt"), path.with_suffix(".key")
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def make_ca(folder: Path, names: tuple[str, ...] = ("service", "other")) -> dict[str, TlsFiles]:
    """A throwaway CA and one certificate per name, each valid for localhost and 127.0.0.1."""
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("turnout test CA"))
        .issuer_name(_name("turnout test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    ca_path, _ = _write_pem(folder / "ca", ca, ca_key)
    files = {}
    for name in names:
        key = ec.generate_private_key(ec.SECP256R1())
        san = x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        )
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(san, critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        cert_path, key_path = _write_pem(folder / name, cert, key)
        files[name] = TlsFiles(cert_path, key_path, ca_path)
    return files


async def _health(address: str, credentials: ClientCredentials | None) -> bool:
    async with client_channel(address, credentials) as channel:
        try:
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3)
        except aio.AioRpcError as exc:
            assert exc.code() is not grpc.StatusCode.UNAUTHENTICATED  # the handshake failed, not the key
            return False
    return True


async def test_mutual_tls(serve_all: Serve, tmp_path: Path) -> None:
    files = make_ca(tmp_path)
    address = await serve_all(SECURITY, files["service"])
    client = files["other"]
    assert await _health(address, ClientCredentials(tls=client))
    # Plaintext to a TLS server fails, and so does TLS without a client certificate (mutual TLS).
    assert not await _health(address, None)
    assert not await _health(address, ClientCredentials(tls=TlsFiles(ca_certs=client.ca_certs)))
    # TLS does not replace the token.
    get_load = next(rpc for rpc in every_rpc() if rpc.path == "/turnout.v1.Engine/GetLoad")
    async with client_channel(address, ClientCredentials(tls=client)) as channel:
        assert await call(channel, get_load) is UNAUTHENTICATED
    async with client_channel(address, ClientCredentials(bearer=TOKEN, tls=client)) as channel:
        assert let_through(await call(channel, get_load))


async def test_tls_without_client_certificates(serve_all: Serve, tmp_path: Path) -> None:
    files = make_ca(tmp_path)
    served = files["service"]
    address = await serve_all(SECURITY, TlsFiles(served.certfile, served.keyfile))
    assert await _health(address, ClientCredentials(tls=TlsFiles(ca_certs=served.ca_certs)))
    assert not await _health(address, None)
    # A server whose certificate the client's CA did not sign is refused.
    stranger = make_ca(tmp_path / "stranger")["other"]
    assert not await _health(address, ClientCredentials(tls=TlsFiles(ca_certs=stranger.ca_certs)))


def test_tls_files_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="go together"):
        TlsFiles(certfile=tmp_path / "c")
    with pytest.raises(ValueError, match="--ssl-ca-certs"):
        TlsFiles(ca_certs=tmp_path / "missing")
