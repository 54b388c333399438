"""Pythonic tool calls (pythonic; llama4_pythonic: the same list, optionally between Llama 4's
`<|python_start|>` and `<|python_end|>`), as Llama 3.2, Llama 4 and ToolACE write them:

    [get_weather(city="San Francisco", unit="celsius"), get_time(zone="PST")]

As vLLM reads them, calls are recognized only when the answer starts with the
list (after whitespace and the optional tag). Arguments are keywords with Python
literal values (strings, numbers, True/False/None, lists, dicts), turned into a
JSON object. The calls are reported when the list closes; a list that is not
valid calls, or one cut off by the end of the output, is all content.
"""

from __future__ import annotations

import ast
import json
from typing import Any

from services.tokenizer.tool_parsers.base import FoundCall
from services.tokenizer.tool_parsers.leading import LeadingCallsParser
from services.tokenizer.tool_parsers.regions import RegionReader, RegionStep


def _call(node: ast.expr) -> FoundCall | None:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        return None
    arguments: dict[str, Any] = {}
    for keyword in node.keywords:
        if keyword.arg is None:  # **kwargs
            return None
        try:
            arguments[keyword.arg] = ast.literal_eval(keyword.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
    try:
        text = json.dumps(arguments, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):  # sets, bytes, complex numbers, NaN: no JSON for them
        return None
    return FoundCall(node.func.id, text)


def python_calls(text: str) -> list[FoundCall] | None:
    """The calls of a Python list literal of calls; None when `text` is anything else."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    if not isinstance(tree.body, ast.List) or not tree.body.elts:
        return None
    calls = [_call(node) for node in tree.body.elts]
    return None if any(call is None for call in calls) else [call for call in calls if call is not None]


class PythonListReader:
    """Finds where the list that starts at `start` closes: brackets counted outside Python strings."""

    def __init__(self, start: int, prefix: str) -> None:
        self._start = start
        self._prefix = prefix
        self._pos = start
        self._depth = 0
        self._quote = ""  # the open string's quote: ', ", ''' or """; empty outside strings
        self._escape = False

    def read(self, buf: str, last: bool) -> RegionStep:
        end = self._scan(buf, last)
        if end is None:
            if not last:
                return RegionStep()
            return RegionStep(end=len(buf), released=self._prefix + buf[self._start :])
        calls = python_calls(buf[self._start : end])
        if calls is None:
            return RegionStep(end=len(buf), released=self._prefix + buf[self._start :])
        return RegionStep(calls=calls, end=end)

    def _scan(self, buf: str, last: bool) -> int | None:
        pos = self._pos
        while pos < len(buf):
            char = buf[pos]
            if self._quote:
                if self._escape:
                    self._escape = False
                elif char == "\\":
                    self._escape = True
                elif buf.startswith(self._quote, pos):
                    pos += len(self._quote) - 1
                    self._quote = ""
                elif char == self._quote[0] and len(self._quote) == 3 and len(buf) - pos < 3 and not last:
                    break  # may be the start of the closing triple quote: wait for more
            elif char in "'\"":
                if len(buf) - pos < 3 and not last:
                    break  # a triple quote may be arriving
                self._quote = char * 3 if buf.startswith(char * 3, pos) else char
                pos += len(self._quote) - 1
            elif char in "([{":
                self._depth += 1
            elif char in ")]}":
                self._depth -= 1
                if self._depth == 0:
                    self._pos = pos + 1
                    return pos + 1
            pos += 1
        self._pos = pos
        return None


class PythonicParser(LeadingCallsParser):
    lead_tags = ("<|python_start|>",)
    opener = "["
    trail_tags = ("<|python_end|>",)

    def _reader_at(self, start: int, prefix: str) -> RegionReader:
        return PythonListReader(start, prefix)
