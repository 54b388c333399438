"""Tokenizer service settings: one frozen dataclass, validated on creation."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from turnout.telemetry.metrics_http import check_metrics_port


@dataclass(frozen=True)
class TokenizerConfig:
    model: Path
    host: str = "127.0.0.1"
    port: int = 50052
    # A Jinja chat template that replaces the model's own (file path or inline text).
    chat_template: str | None = None
    # Port of the Prometheus /metrics HTTP endpoint (None: not served).
    metrics_port: int | None = None

    def __post_init__(self) -> None:
        if not self.model.is_dir():
            raise ValueError(f"--model {self.model}: not a folder")
        if not any((self.model / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
            raise ValueError(f"--model {self.model}: no tokenizer.json or tokenizer_config.json there")
        check_metrics_port(self.metrics_port)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"
