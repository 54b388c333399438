"""Llama 3.x JSON tool calls: an optional `<|python_tag|>`, then `{"name": ..., "parameters": {...}}`
objects separated by `;`.

As vLLM reads them, calls are recognized only when the answer starts with them
(after whitespace); an answer that starts otherwise is plain content. Each
object is reported once it is complete and valid; an object that is not a call
(or text that breaks the form) is released as content with everything after it.
"""

from __future__ import annotations

import enum

from services.tokenizer.tool_parsers.base import ToolParse, ToolParser
from services.tokenizer.tool_parsers.json_text import JsonValueEnd, NotJson, parse_call, skip_whitespace

PYTHON_TAG = "<|python_tag|>"


class _State(enum.Enum):
    LEAD = enum.auto()
    CALLS = enum.auto()
    PLAIN = enum.auto()


class Llama3JsonParser(ToolParser):
    def __init__(self) -> None:
        super().__init__()
        self._state = _State.LEAD
        self._buf = ""
        self._pos = 0  # where the next object starts in _buf
        self._reported_to = 0  # end of the last reported call: later text is released if the form breaks
        self._scanner: JsonValueEnd | None = None

    def feed(self, text: str, *, last: bool = False) -> ToolParse:
        self._buf += text
        out = ToolParse()
        if self._state is _State.LEAD:
            rest = self._buf.lstrip()
            if rest.startswith(PYTHON_TAG):
                self._buf, self._state = rest[len(PYTHON_TAG) :], _State.CALLS
            elif rest.startswith("{"):
                self._buf, self._state = rest, _State.CALLS
            elif not last and PYTHON_TAG.startswith(rest):
                return out
            else:
                self._state = _State.PLAIN
        if self._state is _State.CALLS:
            self._read_calls(out, last)
        if self._state is _State.PLAIN:
            out.content += self._buf
            self._buf = ""
        return out

    def _read_calls(self, out: ToolParse, last: bool) -> None:
        buf = self._buf
        while True:
            if self._scanner is None:
                pos = skip_whitespace(buf, self._pos)
                if self._calls and buf.startswith(";", pos):
                    pos = skip_whitespace(buf, pos + 1)
                if pos == len(buf):
                    if last:
                        self._buf, self._pos = "", 0  # only separators after the last call: dropped
                    return
                self._pos, self._scanner = pos, JsonValueEnd(pos, openers="{")
            try:
                end = self._scanner.scan(buf)
            except NotJson:
                end = -1
            if end is None and not last:
                return
            call = parse_call(buf[self._pos : end]) if end is not None and end >= 0 else None
            if call is None:
                # Not a call after all: it and the rest are the answer's text.
                self._buf, self._state = buf[self._reported_to :], _State.PLAIN
                return
            out.calls.append(self._whole_call(*call))
            assert end is not None
            self._pos, self._reported_to, self._scanner = end, end, None
