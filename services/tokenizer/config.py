"""Tokenizer service settings: one frozen dataclass, validated on creation."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from services.tokenizer.reasoning import reasoning_parser_class
from services.tokenizer.tool_parsers import tool_parser_class
from turnout.security import ServiceSecurity
from turnout.telemetry.metrics_http import check_metrics_port

MIB = 1024 * 1024


def _limit(default: Any, help_text: str, *, metavar: str) -> Any:
    """A limit's declaration: its default, and the help text its --flag (and the docs) show."""
    return field(default=default, metadata={"help": help_text, "metavar": metavar})


@dataclass(frozen=True)
class TokenizerLimits:
    """Bounds on the work one request may cause; each field is a --flag of the same name."""

    max_prompt_bytes: int = _limit(
        4 * MIB,
        "longest prompt in UTF-8 bytes, checked before encoding: a text prompt, a rendered chat (the chat "
        "template's output stops there), the texts of one EncodeTexts together. 4 MiB is about a million "
        "tokens of English, the longest contexts served today",
        metavar="BYTES",
    )
    max_token_ids: int = _limit(
        1 << 20, "most token ids in one Decode or TokenTexts request (1 Mi: beyond any context)", metavar="N"
    )
    max_encode_texts: int = _limit(4096, "most texts in one EncodeTexts request (stop strings, bad words)", metavar="N")
    chat_template_timeout: float = _limit(
        5.0, "seconds a chat template may render before its worker is killed and the request refused", metavar="S"
    )
    chat_template_workers: int = _limit(
        2, "processes rendering chat templates (each one slow template occupies one until the timeout)", metavar="N"
    )

    def __post_init__(self) -> None:
        for name in ("max_prompt_bytes", "max_token_ids", "max_encode_texts", "chat_template_workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{flag_name(name)} must be at least 1, got {getattr(self, name)}")
        if not self.chat_template_timeout > 0:
            raise ValueError(f"--chat-template-timeout must be positive, got {self.chat_template_timeout}")

    @property
    def render_memory_bytes(self) -> int:
        """Address space of a render worker: the interpreter and Jinja (~100 MiB of mappings) plus room for
        the request and an output of max_prompt_bytes in Python's widest string form (4 bytes a character)."""
        return 512 * MIB + 16 * self.max_prompt_bytes


def flag_name(name: str) -> str:
    return name.replace("_", "-")


def add_limit_flags(group: argparse._ActionsContainer, *, defaults_shown: bool = True) -> None:
    """One --flag per TokenizerLimits field. `turnout serve` adds them with no default (None: the
    tokenizer's own), so it forwards only what was given."""
    for f in fields(TokenizerLimits):
        suffix = " (default: %(default)s)" if defaults_shown else f" (tokenizer default: {f.default})"
        group.add_argument(
            f"--{flag_name(f.name)}",
            type=type(f.default),
            default=f.default if defaults_shown else None,
            metavar=f.metadata["metavar"],
            help=f.metadata["help"] + suffix,
        )


def limits_from_args(args: argparse.Namespace) -> TokenizerLimits:
    return TokenizerLimits(**{f.name: getattr(args, f.name) for f in fields(TokenizerLimits)})


def limit_args(args: argparse.Namespace) -> list[str]:
    """The limit flags given to `turnout serve`, as arguments of `turnout tokenizer`."""
    given = ((f.name, getattr(args, f.name)) for f in fields(TokenizerLimits))
    return [arg for name, value in given if value is not None for arg in (f"--{flag_name(name)}", str(value))]


@dataclass(frozen=True)
class TokenizerConfig:
    model: Path
    host: str = "127.0.0.1"
    port: int = 50052
    # A Jinja chat template that replaces the model's own (file path or inline text).
    chat_template: str | None = None
    # Splits `<think>` blocks out for requests with separate_reasoning (a name in reasoning.REASONING_PARSERS).
    reasoning_parser: str | None = None
    # Reads tool calls for tool_choice "auto" (a name in tool_parsers.TOOL_PARSERS).
    tool_call_parser: str | None = None
    # Port of the Prometheus /metrics HTTP endpoint (None: not served).
    metrics_port: int | None = None
    limits: TokenizerLimits = TokenizerLimits()
    # Who may call this service, and TLS (turnout/security.py; the CLI refuses to start without a token).
    security: ServiceSecurity = field(default_factory=ServiceSecurity)

    def __post_init__(self) -> None:
        if self.reasoning_parser is not None:
            reasoning_parser_class(self.reasoning_parser)
        if self.tool_call_parser is not None:
            tool_parser_class(self.tool_call_parser)
        if not self.model.is_dir():
            raise ValueError(f"--model {self.model}: not a folder")
        if not any((self.model / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
            raise ValueError(f"--model {self.model}: no tokenizer.json or tokenizer_config.json there")
        check_metrics_port(self.metrics_port)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"
