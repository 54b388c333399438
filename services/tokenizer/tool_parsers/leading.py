"""Parsers whose calls must open the answer (granite, pythonic / llama4_pythonic).

After leading whitespace and any of the format's optional `lead_tags`, the answer must
start with `opener` for a region reader to take over; otherwise the whole answer
is content (as vLLM reads these formats). Once the calls end, optional closing
tags (`trail_tags`) and the whitespace around them are dropped and the rest is
content. Calls that turn out invalid give back everything held, the tags too.
"""

from __future__ import annotations

import enum
from abc import abstractmethod

from services.tokenizer.tool_parsers.base import ToolParse, ToolParser
from services.tokenizer.tool_parsers.regions import RegionReader


class _State(enum.Enum):
    LEAD = enum.auto()
    CALLS = enum.auto()
    AFTER = enum.auto()
    PLAIN = enum.auto()


class LeadingCallsParser(ToolParser):
    # Tags that may come before the calls, each at most once, in this order.
    lead_tags: tuple[str, ...] = ()
    opener: str
    trail_tags: tuple[str, ...] = ()

    def __init__(self) -> None:
        super().__init__()
        self._state = _State.LEAD
        self._buf = ""
        self._reader: RegionReader | None = None

    @abstractmethod
    def _reader_at(self, start: int, prefix: str) -> RegionReader:
        """The reader for calls starting at `start`; `prefix` is the held text before them (released if invalid)."""

    def feed(self, text: str, *, last: bool = False) -> ToolParse:
        self._buf += text
        out = ToolParse()
        if self._state is _State.LEAD:
            self._lead(last)
        if self._state is _State.CALLS:
            assert self._reader is not None
            step = self._reader.read(self._buf, last)
            out.calls.extend(self._whole_call(*call) for call in step.calls)
            if step.end is not None:
                out.content = step.released
                self._buf = self._buf[step.end :]
                self._state = _State.PLAIN if step.released else _State.AFTER
        if self._state is _State.AFTER:
            self._after(last)
        if self._state is _State.PLAIN:
            out.content += self._buf
            self._buf = ""
        return out

    def _lead(self, last: bool) -> None:
        pos = len(self._buf) - len(self._buf.lstrip())
        for tag in self.lead_tags:
            rest = self._buf[pos:]
            if rest.startswith(tag):
                pos += len(tag)
                pos += len(self._buf[pos:]) - len(self._buf[pos:].lstrip())
            elif not last and rest and tag.startswith(rest):
                return  # a tag may be arriving
        rest = self._buf[pos:]
        if rest.startswith(self.opener):
            self._reader, self._state = self._reader_at(pos, self._buf[:pos]), _State.CALLS
        elif last or rest:
            self._state = _State.PLAIN

    def _after(self, last: bool) -> None:
        rest = self._buf.lstrip()
        for tag in self.trail_tags:
            if rest.startswith(tag):
                rest = rest[len(tag) :].lstrip()
            elif not last and rest and tag.startswith(rest):
                self._buf = rest
                return
        if rest or last:
            self._buf, self._state = rest, _State.PLAIN
        else:
            self._buf = ""
