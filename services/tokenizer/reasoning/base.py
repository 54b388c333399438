"""The reasoning-parser extension point: split a thinking model's streamed text into reasoning and answer.

A parser sees the output text in the pieces it streams in (after stop-string
matching) and returns, per piece, the reasoning and the answer text that became
final. It may hold back text that could still be part of a tag; whatever piece
boundaries the text arrives in, the concatenated results are the same.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ReasoningDelta:
    reasoning: str = ""
    content: str = ""


class ReasoningParser(ABC):
    # The tags that open and close a thinking block (EncodeResponse.thinking_open looks for them too).
    start_tag: str
    end_tag: str

    def __init__(self, *, thinking_open: bool = False) -> None:
        """`thinking_open`: the prompt opened the block, so the output starts inside it."""
        self.thinking_open = thinking_open

    @classmethod
    def thinks(cls, template_kwargs: Mapping[str, Any]) -> bool:
        """Whether a request rendered with these chat_template_kwargs thinks at all; when it does not,
        the parser is off for it and the whole output is answer. Default: always (the parser decides
        from the tags), as for models without a thinking switch."""
        return True

    @abstractmethod
    def feed(self, text: str, *, last: bool = False) -> ReasoningDelta:
        """Add the next piece of output; `last` releases everything still held."""

    @property
    @abstractmethod
    def inside(self) -> bool:
        """The parser is inside a thinking block (a partly seen close tag still counts as inside)."""

    @property
    @abstractmethod
    def undecided(self) -> bool:
        """Outside a block, holding text that may turn out to open one."""

    @property
    @abstractmethod
    def blocks_closed(self) -> int:
        """How many thinking blocks have been closed so far."""
