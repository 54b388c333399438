"""Readers for the stretch of output that holds tool calls, once its start is found.

A reader is given the parser's whole held buffer each time (it only grows while
the reader is active) and keeps its own position in it. Each `read` returns the
calls completed so far, and once the stretch is over, where it ended and any
text to release as content (a call that proved invalid, with the text after it).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from services.tokenizer.tool_parsers.base import FoundCall
from services.tokenizer.tool_parsers.json_text import JsonValueEnd, NotJson, parse_call, skip_whitespace

# Reads the calls out of the text between a call's tags; None when the text is not valid calls.
BodyParser = Callable[[str], list[FoundCall] | None]


def one_json_call(body: str) -> list[FoundCall] | None:
    """`{"name": ..., "arguments"|"parameters": {...}}` (hermes, Qwen2.5, InternLM)."""
    call = parse_call(body)
    return None if call is None else [FoundCall(*call)]


@dataclass
class RegionStep:
    # Calls completed by this read.
    calls: list[FoundCall] = field(default_factory=list)
    # Index in the buffer just past the stretch, once it is over; None while it goes on.
    end: int | None = None
    # Text given back as content (an invalid call).
    released: str = ""


class RegionReader(Protocol):
    def read(self, buf: str, last: bool) -> RegionStep: ...


class TaggedCallReader:
    """The calls between a start and an end tag, read by `parse_body` once the end tag is there:
    `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (hermes, Qwen2.5) by default."""

    def __init__(self, start: int, start_tag: str, end_tag: str, parse_body: BodyParser = one_json_call) -> None:
        self._start = start  # index of the body, just past the start tag
        self._start_tag = start_tag
        self._end_tag = end_tag
        self._parse_body = parse_body
        self._searched = start

    def read(self, buf: str, last: bool) -> RegionStep:
        index = buf.find(self._end_tag, self._searched)
        if index < 0 and not last:
            # The end tag may begin in the last few characters: look there again next time.
            self._searched = max(self._start, len(buf) - len(self._end_tag) + 1)
            return RegionStep()
        # At the end of the output a call whose end tag never came still counts if its body is whole.
        end = len(buf) if index < 0 else index + len(self._end_tag)
        calls = self._parse_body(buf[self._start : len(buf) if index < 0 else index])
        if calls is None:
            return RegionStep(end=end, released=self._start_tag + buf[self._start : end])
        return RegionStep(calls=calls, end=end)


class _Array(enum.Enum):
    OPEN = enum.auto()
    ELEMENT = enum.auto()
    IN_ELEMENT = enum.auto()
    AFTER_ELEMENT = enum.auto()


class CallArrayReader:
    """A JSON array of call objects, each reported as soon as it is complete (mistral, tool_choice required).

    `[{"name": ..., "arguments"|"parameters": {...}}, ...]`; a single object without
    the brackets is read as a one-call array. When the form breaks, the text from the
    end of the last reported call (with `prefix`, the text that opened the stretch,
    when no call was reported at all) up to where it broke is released, and the
    stretch ends there: the parser reads on from that point, so a later tag still
    opens calls, wherever the chunks happened to end.
    """

    def __init__(self, start: int, prefix: str = "") -> None:
        self._pos = start
        self._prefix = prefix
        self._state = _Array.OPEN
        self._bare_object = False
        self._element_start = start
        self._scanner: JsonValueEnd | None = None
        self._reported = 0
        # Text before this index went into reported calls; what follows is released if the form breaks.
        self._unreported_from = start

    def read(self, buf: str, last: bool) -> RegionStep:
        step = RegionStep()
        while step.end is None and self._advance(buf, step):
            pass
        if step.end is None and last:
            self._release(buf, step)
        self._reported += len(step.calls)
        return step

    def _advance(self, buf: str, step: RegionStep) -> bool:
        """One move of the state machine; False when more text is needed."""
        pos = skip_whitespace(buf, self._pos)
        if self._state is not _Array.IN_ELEMENT and pos == len(buf):
            return False
        if self._state is _Array.OPEN:
            if buf[pos] == "[":
                self._pos, self._state = pos + 1, _Array.ELEMENT
            elif buf[pos] == "{":
                self._bare_object, self._pos, self._state = True, pos, _Array.ELEMENT
            else:
                self._release(buf, step, pos)
            return True
        if self._state is _Array.ELEMENT:
            if buf[pos] == "]" and self._reported + len(step.calls) == 0 and not self._bare_object:
                step.end = pos + 1  # an empty array: no calls
                return True
            self._element_start, self._scanner = pos, JsonValueEnd(pos, openers="{")
            self._pos, self._state = pos, _Array.IN_ELEMENT
            return True
        if self._state is _Array.IN_ELEMENT:
            assert self._scanner is not None
            try:
                end = self._scanner.scan(buf)
            except NotJson:
                self._release(buf, step, self._element_start)
                return True
            if end is None:
                return False
            call = parse_call(buf[self._element_start : end])
            if call is None:
                self._release(buf, step, end)
                return True
            step.calls.append(FoundCall(*call))
            self._unreported_from = end
            if self._bare_object:
                step.end = end
            self._pos, self._state = end, _Array.AFTER_ELEMENT
            return True
        if buf[pos] == ",":
            self._pos, self._state = pos + 1, _Array.ELEMENT
        elif buf[pos] == "]":
            step.end = pos + 1
        else:
            self._release(buf, step, pos)
        return True

    def _release(self, buf: str, step: RegionStep, upto: int | None = None) -> None:
        """Give back the held text not reported as a call, up to `upto` (default: all); the stretch is over."""
        end = len(buf) if upto is None else max(upto, self._unreported_from)
        prefix = "" if self._reported + len(step.calls) else self._prefix
        step.end, step.released = end, prefix + buf[self._unreported_from : end]


def call_array(body: str) -> list[FoundCall] | None:
    """A whole JSON array of call objects (or one bare object) and nothing else but whitespace (jamba)."""
    step = CallArrayReader(0).read(body, True)
    if not step.calls or step.released or step.end is None or body[step.end :].strip():
        return None
    return step.calls
