"""Who may call a service, and over what: the settings every Turnout service shares.

Declared once here: the flags (`add_security_flags`), the environment they fall back to, and the
frozen `ServiceSecurity` each service's config holds. `turnout/grpc_auth.py` enforces it on gRPC,
`gateway/` on HTTP; docs/security.md is the threat model.

Secrets never travel on a command line (`ps` shows those to every local user): `turnout serve`
hands them to its children in the environment; a deployment gives each service a file.
"""

from __future__ import annotations

import argparse
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from turnout.flag_parser import AppendAction

# The shared secret between the services of one deployment; `turnout serve` generates one per start.
INTERNAL_TOKEN_ENV = "TURNOUT_INTERNAL_TOKEN"
API_KEY_ENV = "TURNOUT_API_KEY"
ADMIN_KEY_ENV = "TURNOUT_ADMIN_KEY"


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of one service: its certificate and key (served, and shown to peers as a client
    certificate), and the CA that signs its peers. A server given the CA requires client
    certificates (mutual TLS); a client given it verifies servers with it (else the system roots)."""

    certfile: Path | None = None
    keyfile: Path | None = None
    ca_certs: Path | None = None

    def __post_init__(self) -> None:
        if (self.certfile is None) != (self.keyfile is None):
            raise ValueError("--ssl-certfile and --ssl-keyfile go together")
        for flag, path in (("--ssl-certfile", self.certfile), ("--ssl-keyfile", self.keyfile)):
            if path is not None and not path.is_file():
                raise ValueError(f"{flag} {path}: no such file")
        if self.ca_certs is not None and not self.ca_certs.is_file():
            raise ValueError(f"--ssl-ca-certs {self.ca_certs}: no such file")

    @property
    def serves_tls(self) -> bool:
        return self.certfile is not None

    def server_credentials(self) -> grpc.ServerCredentials:
        assert self.certfile is not None and self.keyfile is not None
        ca = self.ca_certs.read_bytes() if self.ca_certs is not None else None
        pair = (self.keyfile.read_bytes(), self.certfile.read_bytes())
        return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=ca is not None)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_certs.read_bytes() if self.ca_certs is not None else None,
            private_key=self.keyfile.read_bytes() if self.keyfile is not None else None,
            certificate_chain=self.certfile.read_bytes() if self.certfile is not None else None,
        )


@dataclass(frozen=True)
class ClientCredentials:
    """What a client channel presents: `authorization: Bearer <bearer>` on every call (unless the
    call sets its own), over TLS when `tls` is set."""

    bearer: str | None = field(default=None, repr=False)
    tls: TlsFiles | None = None


@dataclass(frozen=True)
class ServiceSecurity:
    """One service's credentials and the keys it accepts (see docs/security.md).

    `internal_token`: what the services of one deployment show each other; every RPC but the health
    service needs it. None only with `insecure_internal` (development): internal RPCs are then open.
    `api_keys`: when set, the router's public Inference service needs one of them (or the token).
    `admin_key`: the admin RPCs (engines, caches, aborts) need it; without one they are refused.
    The default (no token, open) is what in-process tests and the offline `LLM` use; the command
    lines build theirs with `from_args`, which refuses to start without a token.
    """

    internal_token: str | None = field(default=None, repr=False)
    insecure_internal: bool = True
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    admin_key: str | None = field(default=None, repr=False)
    tls: TlsFiles | None = None

    def __post_init__(self) -> None:
        if self.internal_token is None and not self.insecure_internal:
            raise ValueError(
                f"no internal token: set ${INTERNAL_TOKEN_ENV} or --internal-token-file (`turnout serve` does it "
                "for its children), or pass --insecure-internal to run without one (development only)"
            )
        if self.internal_token == "" or any(not key for key in self.api_keys) or self.admin_key == "":
            raise ValueError("the internal token, API keys and the admin key must not be empty")

    @property
    def client(self) -> ClientCredentials:
        """What this service's own channels to its peers present."""
        return ClientCredentials(bearer=self.internal_token, tls=self.tls)

    @classmethod
    def from_args(cls, args: argparse.Namespace, env: Mapping[str, str] = os.environ) -> ServiceSecurity:
        """The flags of `add_security_flags`, falling back to the environment; ValueError names a bad one."""
        token = env.get(INTERNAL_TOKEN_ENV) or None
        if args.internal_token_file is not None:
            try:
                token = args.internal_token_file.read_text().strip()
            except OSError as exc:
                raise ValueError(f"--internal-token-file {args.internal_token_file}: {exc.strerror}") from None
        # The environment holds one key a line (`turnout serve --api-key A --api-key B`).
        api_keys = args.api_key or [key for key in env.get(API_KEY_ENV, "").split("\n") if key]
        return cls(
            internal_token=token,
            insecure_internal=args.insecure_internal,
            api_keys=tuple(api_keys),
            admin_key=args.admin_key or env.get(ADMIN_KEY_ENV) or None,
            tls=tls_from_args(args),
        )


def tls_from_args(args: argparse.Namespace) -> TlsFiles | None:
    files = (args.ssl_certfile, args.ssl_keyfile, args.ssl_ca_certs)
    return TlsFiles(*files) if any(f is not None for f in files) else None


def add_security_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of `ServiceSecurity` (the same on every service; `turnout serve` forwards them)."""
    group = parser.add_argument_group("security (see docs/security.md)")
    group.add_argument(
        "--internal-token-file",
        type=Path,
        default=None,
        metavar="PATH",
        help=f"file holding the token the services of this deployment share (default: ${INTERNAL_TOKEN_ENV})",
    )
    group.add_argument(
        "--insecure-internal",
        action="store_true",
        help="run without an internal token: every internal RPC is open to anyone who can connect (development)",
    )
    group.add_argument(
        "--api-key",
        action=AppendAction,
        default=None,
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' on the public API (HTTP, and the router's Inference service); "
        f"repeat for several keys (default: ${API_KEY_ENV}, else no key)",
    )
    group.add_argument(
        "--admin-key",
        default=None,
        metavar="KEY",
        help="key the admin operations need (engines, cache flush, aborts); without one they are refused "
        f"(default: ${ADMIN_KEY_ENV})",
    )
    group.add_argument("--ssl-certfile", type=Path, default=None, help="PEM certificate: serve TLS")
    group.add_argument("--ssl-keyfile", type=Path, default=None, help="PEM private key of --ssl-certfile")
    group.add_argument(
        "--ssl-ca-certs",
        type=Path,
        default=None,
        help="PEM CA: peers are verified with it, and clients must show a certificate it signed (mutual TLS)",
    )


# -- `turnout serve`: what its children get --------------------------------------


def stack_environment(args: argparse.Namespace) -> dict[str, str]:
    """The secrets of a `turnout serve` stack, for its children's environment: a fresh internal
    token (or the one in --internal-token-file; none with --insecure-internal), the API keys and the
    admin key."""
    env: dict[str, str] = {}
    if args.internal_token_file is not None:
        env[INTERNAL_TOKEN_ENV] = args.internal_token_file.read_text().strip()
    elif not args.insecure_internal:
        env[INTERNAL_TOKEN_ENV] = secrets.token_urlsafe(32)
    if args.api_key:
        env[API_KEY_ENV] = "\n".join(args.api_key)
    if args.admin_key:
        env[ADMIN_KEY_ENV] = args.admin_key
    return env


def stack_flags(args: argparse.Namespace) -> list[str]:
    """The flags of `add_security_flags` every child of `turnout serve` gets (no secrets: paths)."""
    flags = ["--insecure-internal"] if args.insecure_internal else []
    for name in ("ssl_certfile", "ssl_keyfile", "ssl_ca_certs"):
        value = getattr(args, name)
        if value is not None:
            flags += [f"--{name.replace('_', '-')}", str(value)]
    return flags


def launcher_credentials(args: argparse.Namespace) -> ClientCredentials:
    """What `turnout serve`'s own health probes present (TLS only: the health service is open)."""
    return ClientCredentials(tls=tls_from_args(args))
