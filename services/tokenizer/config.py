"""Tokenizer service settings: one frozen dataclass, validated on creation."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from services.tokenizer.reasoning import reasoning_parser_class
from services.tokenizer.tool_parsers import tool_parser_class
from turnout.security import ServiceSecurity
from turnout.telemetry.metrics_http import check_metrics_port


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
