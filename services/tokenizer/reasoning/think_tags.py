"""Thinking blocks between tags, read incrementally; the deepseek-r1, qwen3 and think parsers.

States, and what each does with the held text `_buf`:

    LEAD           output start, only whitespace so far: a start tag here opens a block
    INSIDE_LEAD    just inside a block: leading whitespace is dropped (and, when the block
                   was opened by the prompt, one repeated start tag)
    INSIDE         reasoning: held back only a possible close-tag prefix and trailing
                   whitespace (dropped if the close tag follows)
    AFTER_CLOSE    whitespace right after the close tag is dropped (as the peers' one-shot
                   parsers strip the answer)
    CONTENT        answer text; watches for another start tag (`think` only)
    PLAIN          answer text passes through unchanged

A parser may accept several spellings of each tag (`start_tags`, `end_tags`; the
first is the canonical one), and `implicit_ends`: text that ends the block and
stays in the answer (a tool-call opener some models write without closing the
block first).

Per model, as SGLang and vLLM document them: deepseek-r1 starts inside the block
(everything before `</think>` is reasoning, with or without `<think>`); qwen3
reasons only in a block that opens the output (or that the prompt opened,
`thinking_open`); `think` also accepts blocks later in the text. Output that
ends inside a block is all reasoning (truncated thinking).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from services.tokenizer.reasoning.base import ReasoningDelta, ReasoningParser


class _State(enum.Enum):
    LEAD = enum.auto()
    INSIDE_LEAD = enum.auto()
    INSIDE = enum.auto()
    AFTER_CLOSE = enum.auto()
    CONTENT = enum.auto()
    PLAIN = enum.auto()


def partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:length]):
            return length
    return 0


def partial_suffix_any(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `tags`."""
    return max((partial_suffix(text, tag) for tag in tags), default=0)


def find_first(text: str, tags: tuple[str, ...]) -> tuple[int, str] | None:
    """(index, tag) of the earliest of `tags` in `text` (the longest one at a tie); None if none occurs."""
    best: tuple[int, str] | None = None
    for tag in tags:
        index = text.find(tag)
        if index >= 0 and (best is None or index < best[0] or (index == best[0] and len(tag) > len(best[1]))):
            best = (index, tag)
    return best


def _leading(text: str, tags: tuple[str, ...]) -> str | None:
    return next((tag for tag in tags if text.startswith(tag)), None)


class ThinkTagParser(ReasoningParser):
    start_tag = "<think>"
    end_tag = "</think>"
    start_tags: tuple[str, ...] = (start_tag,)
    end_tags: tuple[str, ...] = (end_tag,)
    implicit_ends: tuple[str, ...] = ()
    # The output starts inside a block even when the prompt did not open one.
    starts_inside = False
    # A start tag later in the answer opens another block.
    blocks_anywhere = False

    def __init__(self, *, thinking_open: bool = False) -> None:
        super().__init__(thinking_open=thinking_open)
        inside = thinking_open or self.starts_inside
        self._state = _State.INSIDE_LEAD if inside else _State.LEAD
        # A block the prompt opened (or a forced one) may still begin with its own start tag: drop it.
        self._may_drop_start = inside
        self._buf = ""
        self._closed = 0

    @property
    def inside(self) -> bool:
        return self._state in (_State.INSIDE_LEAD, _State.INSIDE)

    @property
    def undecided(self) -> bool:
        return self._state in (_State.LEAD, _State.CONTENT) and bool(self._buf)

    @property
    def blocks_closed(self) -> int:
        return self._closed

    def feed(self, text: str, *, last: bool = False) -> ReasoningDelta:
        self._buf += text
        reasoning: list[str] = []
        content: list[str] = []
        while self._step(reasoning, content, last):
            pass
        return ReasoningDelta("".join(reasoning), "".join(content))

    def _step(self, reasoning: list[str], content: list[str], last: bool) -> bool:
        """Handle the held text in the current state; True when the state changed and there is more to do."""
        buf, starts = self._buf, self.start_tags
        state = self._state
        if state is _State.LEAD:
            rest = buf.lstrip()
            tag = _leading(rest, starts)
            if tag is not None:
                self._open(rest[len(tag) :])
                return True
            if not last and any(start.startswith(rest) for start in starts):  # empty or a partial start tag: wait
                return False
            self._state = self._answer_state
            return True
        if state is _State.INSIDE_LEAD:
            rest = buf.lstrip()
            tag = _leading(rest, starts) if self._may_drop_start else None
            if tag is not None:
                self._open(rest[len(tag) :])
                return True
            if not rest or (not last and self._may_drop_start and any(start.startswith(rest) for start in starts)):
                self._buf = rest
                return False
            self._buf, self._state = rest, _State.INSIDE
            return True
        if state is _State.INSIDE:
            ends = self.end_tags + self.implicit_ends
            found = find_first(buf, ends)
            if found is not None:
                index, tag = found
                reasoning.append(buf[:index].rstrip())
                self._closed += 1
                if tag in self.implicit_ends:  # the tag is the answer's first text
                    self._buf, self._state = buf[index:], self._answer_state
                else:
                    self._buf, self._state = buf[index + len(tag) :], _State.AFTER_CLOSE
                return True
            if last:
                reasoning.append(buf.rstrip())
                self._buf = ""
                return False
            hold_from = len(buf[: len(buf) - partial_suffix_any(buf, ends)].rstrip())
            reasoning.append(buf[:hold_from])
            self._buf = buf[hold_from:]
            return False
        if state is _State.AFTER_CLOSE:
            rest = buf.lstrip()
            self._buf = rest
            if not rest:
                return False
            self._state = self._answer_state
            return True
        if state is _State.CONTENT:
            found = find_first(buf, starts)
            if found is not None:
                index, tag = found
                content.append(buf[:index])
                self._open(buf[index + len(tag) :])
                return True
            keep = 0 if last else partial_suffix_any(buf, starts)
            content.append(buf[: len(buf) - keep])
            self._buf = buf[len(buf) - keep :]
            return False
        content.append(buf)
        self._buf = ""
        return False

    @property
    def _answer_state(self) -> _State:
        return _State.CONTENT if self.blocks_anywhere else _State.PLAIN

    def _open(self, rest: str) -> None:
        self._buf, self._state, self._may_drop_start = rest, _State.INSIDE_LEAD, False


class DeepSeekR1Parser(ThinkTagParser):
    starts_inside = True


class Qwen3Parser(ThinkTagParser):
    @classmethod
    def thinks(cls, template_kwargs: Mapping[str, Any]) -> bool:
        # Qwen3's template thinks unless the request turns it off.
        return bool(template_kwargs.get("enable_thinking", True))


class GenericThinkParser(ThinkTagParser):
    blocks_anywhere = True
