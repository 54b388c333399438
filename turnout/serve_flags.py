"""The flags of `turnout serve`: its own (`ServeConfig`) and every child's, from their declarations.

Each engine, tokenizer, router and gateway flag is declared once, on its service's config
(turnout/flags.py). `turnout serve` takes all of them, bar the few it writes itself for a child
(`CHILDREN`: addresses, ports, the model), with the same names, aliases and defaults; `child_flags`
writes the ones whose value is not the default onto that child's command line. A flag declared by
two services (none today) would be one flag of `turnout serve` given to both.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from gateway.config import GatewayConfig
from services.engine.config import EngineConfig
from services.router.config import RouterConfig
from services.tokenizer.config import TokenizerConfig, TokenizerLimits
from turnout.flag_parser import FlagParser, env_name
from turnout.flags import Declared, add_argument, declared, flag, to_argv

MODEL_HELP = (
    "the model: a Hugging Face model folder (default: SmolLM2-135M-Instruct, converted once); "
    "also given as the first positional argument, as `vllm serve MODEL`"
)


@dataclass(frozen=True)
class ServeConfig:
    """What `turnout serve` itself decides: the model, the replicas, the ports of the children."""

    model: str | None = flag(None, MODEL_HELP, aliases=("--model-path",), metavar="MODEL")
    # Kept as given (a folder, or a reference the model resolution turns into one).
    tokenizer: str | None = flag(
        None, "tokenizer files, when not the model's (a folder)", aliases=("--tokenizer-path",), metavar="TOKENIZER"
    )
    revision: str | None = flag(None, "the model's revision (branch, tag or commit) when it comes from a hub")
    download_dir: str | None = flag(None, "where models from a hub are kept (default: the Hugging Face cache)")
    engines: int = flag(
        1,
        "engine replicas behind the router, one per GPU when there are several; with --engine-port, replica i "
        "listens on that port + i",
        aliases=("--data-parallel-size", "--dp-size"),
    )
    api_server_count: int = flag(
        1,
        "gateway processes serving the HTTP port together (vLLM's flag): more than one where one gateway's "
        'core is the HTTP ceiling (docs/architecture.md, "Several gateway processes")',
    )
    # turnout/cpu_cores.py: the engines' OpenMP teams off the services' cores.
    cpu_reserved_cores: int = flag(
        0,
        "CPUs kept for the gateway, router, tokenizer and the engines' event loops (the first N this process may "
        "use); each engine replica's compute threads get a share of the others (--cpu-cores). 0: no binding",
        metavar="N",
    )
    engine_port: int = flag(0, "gRPC port of the (first) engine; 0: a free one")
    tokenizer_port: int = flag(0, "gRPC port of the tokenizer; 0: a free one")
    router_port: int = flag(0, "gRPC port of the router; 0: a free one")
    startup_timeout: float = flag(600.0, "seconds to wait for all services to be healthy", metavar="SECONDS")
    metrics: bool = flag(
        False,
        "serve Prometheus /metrics of the engine(s), tokenizer, router and launcher on free ports (printed at "
        "start); the gateway's is always at /metrics on its HTTP port",
        aliases=("--enable-metrics",),
    )

    def __post_init__(self) -> None:
        if self.engines < 1:
            raise ValueError(f"--engines must be at least 1, got {self.engines}")
        if self.cpu_reserved_cores < 0:
            raise ValueError(f"--cpu-reserved-cores must be 0 or more, got {self.cpu_reserved_cores}")
        if self.api_server_count < 1:
            raise ValueError(f"--api-server-count must be at least 1, got {self.api_server_count}")
        for name in ("engine_port", "tokenizer_port", "router_port"):
            if not 0 <= getattr(self, name) < 65536:
                raise ValueError(f"--{name.replace('_', '-')} must be a port number, got {getattr(self, name)}")


@dataclass(frozen=True)
class ChildFlags:
    """One kind of child: the configs whose flags it takes, and the fields the launcher writes itself."""

    service: str
    configs: tuple[type, ...]
    own: frozenset[str]

    def flags(self) -> list[Declared]:
        return [d for cls in self.configs for d in declared(cls) if d.field not in self.own]


ENGINE = ChildFlags("engine", (EngineConfig,), frozenset({"model", "host", "port", "served_model_name"}))
TOKENIZER = ChildFlags(
    "tokenizer", (TokenizerConfig, TokenizerLimits), frozenset({"model", "tokenizer", "host", "port"})
)
ROUTER = ChildFlags("router", (RouterConfig,), frozenset({"engines", "tokenizers", "host", "port"}))
GATEWAY = ChildFlags("gateway", (GatewayConfig,), frozenset({"router_address"}))
CHILDREN = (ENGINE, TOKENIZER, ROUTER, GATEWAY)


def forwarded() -> dict[str, tuple[Declared, list[str]]]:
    """Each flag `turnout serve` passes on, by field name: its declaration and the services taking it."""
    out: dict[str, tuple[Declared, list[str]]] = {}
    own = {d.field for d in declared(ServeConfig)}
    for child in CHILDREN:
        for d in child.flags():
            if d.field in own:
                raise TypeError(f"{child.service}'s {d.flag} has the name of a flag of turnout serve itself")
            if d.field in out:
                first, services = out[d.field]
                if (first.spellings, first.kind, first.default) != (d.spellings, d.kind, d.default):
                    raise TypeError(f"{d.flag} is declared differently by {services[0]} and {child.service}")
                services.append(child.service)
            else:
                out[d.field] = (d, [child.service])
    return out


def add_serve_flags(parser: FlagParser) -> None:
    parser.add_argument("model_arg", nargs="?", default=None, metavar="MODEL", help="the model, as --model")
    parser.positional_of["model_arg"] = "model"
    for d in declared(ServeConfig):
        add_argument(parser, d)
    groups = {
        child.service: parser.add_argument_group(f"{child.service} (passed to every {child.service})")
        for child in CHILDREN
    }
    for d, services in forwarded().values():
        add_argument(groups[services[0]], d, services)


def serve_config(args: argparse.Namespace) -> ServeConfig:
    return ServeConfig(**{d.field: getattr(args, d.field) for d in declared(ServeConfig)})


def child_flags(args: argparse.Namespace, child: ChildFlags) -> list[str]:
    """The flags of `turnout serve` meant for `child` whose value is not the default, as `child`'s
    command-line words (unset ones leave the child's own default, the same declaration)."""
    words: list[str] = []
    for d in child.flags():
        value: Any = getattr(args, d.field)
        if isinstance(value, list):
            value = tuple(value)
        if value != d.default:
            words += to_argv(d, value)
    return words


def flag_environment() -> set[str]:
    """The TURNOUT_* variables that are flags of `turnout serve`: read by the launcher, and not passed
    to its children, which get every value on their command line (a child's flag of the same name,
    such as the router's address --tokenizer, must not read them)."""
    names: set[str] = set()
    for d in [*declared(ServeConfig), *(d for d, _ in forwarded().values())]:
        names.update(env_name(spelling) for spelling in (d.flag, *d.spec.negations))
    return names
