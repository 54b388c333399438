"""Gateway settings: one frozen dataclass, validated on creation."""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field

from turnout.flags import flag
from turnout.security import ServiceSecurity

UVICORN_LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")

# 32 MiB: far above any prompt that fits a context, far below what hurts the process.
DEFAULT_MAX_REQUEST_BYTES = 32 * 1024 * 1024
# Responses kept for previous_response_id and GET /v1/responses/{id}: each holds its whole
# conversation, so the count is the bound on the store's memory (x the largest conversation).
DEFAULT_RESPONSES_STORE_SIZE = 1024
# A batch runs all its prompts at once: 1024 fills, and does not overflow, the router's
# default concurrency (--max-concurrent-requests) and the engine's queue (--max-waiting-requests).
DEFAULT_MAX_CLIENT_BATCH_SIZE = 1024


def string_list(value: str) -> tuple[str, ...]:
    """A JSON list of strings, as vLLM takes its CORS flags (a comma-separated list works too)."""
    if not value.lstrip().startswith("["):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not a JSON list: {exc}") from None
    if not isinstance(parsed, list) or not all(isinstance(item, str) for item in parsed):
        raise argparse.ArgumentTypeError(f"expected a JSON list of strings, got {value}")
    return tuple(parsed)


@dataclass(frozen=True)
class GatewayConfig:
    """Where the router is, where the gateway listens, and the HTTP surface's options.

    `request_timeout_s` bounds each gRPC call to the router (None: no deadline);
    a call that runs past it answers HTTP 504.
    `router_ready_timeout_s`: how long a request waits for a router that is down
    (restarting) to come back before it answers 503.
    `served_model_names` are names clients may use for the router's default
    model (vLLM's `--served-model-name a b`); the first is the one responses
    report. Empty: the router's own names only.
    `security`: the API keys (when set, every route but the probes needs `Authorization: Bearer
    <key>`), the admin key of the admin routes, the internal token the router channel presents, and
    TLS (HTTPS, and the router channel's certificates); see docs/security.md.
    `allowed_*` / `allow_credentials`: the CORS policy (vLLM's flags and defaults).
    `root_path`: the prefix a reverse proxy serves the gateway under.
    `max_request_bytes`: larger request bodies are answered 413.
    `responses_store_size`: most responses `/v1/responses` keeps (an LRU).
    `responses_store_file`: where that LRU lives when several gateway processes share it (SQLite).
    `max_client_batch_size`: most prompts (or texts, or token lists) in one request's batch
    (TGI's `--max-client-batch-size`); a larger batch is answered 400.
    """

    router_address: str = flag(help="router gRPC address, e.g. 127.0.0.1:50050", name="--router", metavar="ADDR")
    host: str = flag("127.0.0.1", "address to listen on")
    port: int = flag(8000, "port to listen on")
    request_timeout_s: float | None = flag(
        None,
        "deadline of each call to the router; past it the client gets 504",
        name="--request-timeout",
        metavar="SECONDS",
    )
    router_ready_timeout_s: float = flag(
        10.0,
        "how long a request waits for a router that is down (restarting) before 503; 0: no wait",
        name="--router-ready-timeout",
        metavar="SECONDS",
    )
    served_model_names: tuple[str, ...] = flag(
        (),
        "names clients may use for the router's default model; responses report the first (default: the "
        "router's names)",
        name="--served-model-name",
        metavar="NAME",
    )
    allowed_origins: tuple[str, ...] = flag(("*",), "CORS origins, a JSON list", parse=string_list, metavar="JSON")
    allowed_methods: tuple[str, ...] = flag(("*",), "CORS methods, a JSON list", parse=string_list, metavar="JSON")
    allowed_headers: tuple[str, ...] = flag(("*",), "CORS headers, a JSON list", parse=string_list, metavar="JSON")
    allow_credentials: bool = flag(False, "CORS: allow credentials")
    root_path: str = flag("", "path prefix when served behind a reverse proxy, e.g. /llm (default: none)")
    max_request_bytes: int = flag(DEFAULT_MAX_REQUEST_BYTES, "larger request bodies are answered 413")
    max_client_batch_size: int = flag(
        DEFAULT_MAX_CLIENT_BATCH_SIZE, "most prompts in one request's batch; a larger batch is answered 400"
    )
    responses_store_size: int = flag(
        DEFAULT_RESPONSES_STORE_SIZE,
        "most responses /v1/responses keeps for previous_response_id (least recently used go first); 0: none",
    )
    responses_store_file: str | None = flag(
        None,
        "keep the /v1/responses store in this SQLite file, shared by every gateway process that names it "
        "(turnout serve --api-server-count gives its gateways one); default: in this process's memory",
        metavar="PATH",
    )
    # vLLM's --response-role: the role of the assistant's message in chat completion responses.
    response_role: str = flag("assistant", "role of the reply message in chat completions")
    # vLLM's --return-tokens-as-token-ids: the default of the request field of that name.
    return_tokens_as_token_ids: bool = flag(
        False, "logprobs show tokens as 'token_id:ID' unless a request says otherwise"
    )
    # One access-log line per HTTP request (vLLM's --enable-log-requests, SGLang's --log-requests).
    enable_log_requests: bool = flag(
        False,
        "log one line per HTTP request (method, path, status)",
        aliases=("--log-requests",),
        negations=("--disable-log-requests",),
    )
    # Level of uvicorn's own loggers (its server messages), as vLLM's --uvicorn-log-level.
    uvicorn_log_level: str = flag("info", "level of the HTTP server's own messages", choices=UVICORN_LOG_LEVELS)
    # Its secrets are repr=False: they never reach logs; /get_server_info leaves it out.
    security: ServiceSecurity = field(default_factory=ServiceSecurity)

    def __post_init__(self) -> None:
        if not self.router_address.strip():
            raise ValueError("router_address must not be empty (e.g. 127.0.0.1:50051)")
        if not self.host.strip():
            raise ValueError("host must not be empty")
        # Port 0 lets the OS pick a free port (tests use it).
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.request_timeout_s is not None and not (
            math.isfinite(self.request_timeout_s) and self.request_timeout_s > 0
        ):
            raise ValueError(f"request_timeout_s must be a positive number or None, got {self.request_timeout_s}")
        if not (math.isfinite(self.router_ready_timeout_s) and self.router_ready_timeout_s >= 0):
            raise ValueError(f"router_ready_timeout_s must be >= 0 seconds, got {self.router_ready_timeout_s}")
        if any(not name.strip() for name in self.served_model_names):
            raise ValueError("served model names must not be empty")
        if len(set(self.served_model_names)) != len(self.served_model_names):
            raise ValueError(f"served model names must be distinct, got {list(self.served_model_names)}")
        if self.root_path and (not self.root_path.startswith("/") or self.root_path.endswith("/")):
            raise ValueError(f"root_path must start with '/' and not end with one (e.g. /llm), got {self.root_path!r}")
        if self.max_request_bytes < 1:
            raise ValueError(f"max_request_bytes must be positive, got {self.max_request_bytes}")
        if not self.response_role.strip():
            raise ValueError("response_role must not be empty")
        if self.responses_store_size < 0:
            raise ValueError(f"responses_store_size must be >= 0, got {self.responses_store_size}")
        if self.max_client_batch_size < 1:
            raise ValueError(f"max_client_batch_size must be positive, got {self.max_client_batch_size}")

    @property
    def reported_model_name(self) -> str | None:
        """The name responses report for the default model; None: the router's own name."""
        return self.served_model_names[0] if self.served_model_names else None
