"""Turnout: an LLM serving stack of four gRPC services behind an OpenAI-compatible gateway.

This package holds what every service shares: the generated wire contract
(`turnout.v1`), the CLI, logging, errors and the gRPC server runner.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # `from turnout import LLM` without making every `turnout` command import torch.
    if name == "LLM":
        from services.engine.llm import LLM

        return LLM
    raise AttributeError(f"module 'turnout' has no attribute {name!r}")
