"""The tool-call-parser extension point: read function calls out of streamed model output.

A parser is fed the answer text (after stop strings and reasoning are taken
out) in the pieces it streams in, and returns per piece the ordinary text that
became final and the tool-call pieces read so far. Text that is (or may be)
part of a call is held back from the content; text that turns out not to be a
valid call is released as content, so nothing is lost. Whatever the piece
boundaries, the concatenated content and calls are the same (ids aside).
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import NamedTuple


@dataclass(frozen=True)
class ToolCallPiece:
    """One ToolCallDelta: id and name on a call's first piece only; arguments fragments concatenate."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


class FoundCall(NamedTuple):
    """A complete call read from the text; `id` only where the model writes its own (Kimi-K2)."""

    name: str
    arguments: str
    id: str = ""


@dataclass
class ToolParse:
    content: str = ""
    calls: list[ToolCallPiece] = field(default_factory=list)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolParser(ABC):
    def __init__(self) -> None:
        self._calls = 0

    @abstractmethod
    def feed(self, text: str, *, last: bool = False) -> ToolParse:
        """Add the next piece of answer text; `last` releases or completes everything held."""

    def _whole_call(self, name: str, arguments: str, call_id: str = "") -> ToolCallPiece:
        """A complete call as one piece, numbered after the previous calls, with the model's id or a fresh one."""
        piece = ToolCallPiece(self._calls, call_id or new_call_id(), name, arguments)
        self._calls += 1
        return piece
