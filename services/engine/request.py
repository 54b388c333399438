"""What the engine's core takes and gives back: plain dataclasses, no protobuf."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from services.engine.sampling import SamplingSettings


@dataclass(frozen=True)
class EngineRequest:
    request_id: str
    input_ids: tuple[int, ...]
    sampling: SamplingSettings


@dataclass(frozen=True)
class Finish:
    kind: Literal["stop", "length", "abort"]
    # For "stop": the EOS or stop token id that matched.
    matched_token_id: int | None = None
    # For "abort": why.
    message: str = ""


@dataclass(frozen=True)
class EngineOutput:
    """New tokens of a request; `finish` is set on its last output."""

    token_ids: list[int]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    finish: Finish | None = field(default=None)

    @property
    def finished(self) -> bool:
        return self.finish is not None


@dataclass(frozen=True)
class LoadReport:
    running: int
    waiting: int
    kv_tokens_used: int
    kv_tokens_capacity: int
