"""JSON helpers for tool-call parsers: where a streamed object or array ends, and what a call object says.

`JsonValueEnd` scans a growing buffer once, character by character, tracking
only nesting depth and string/escape state; it says where the value that starts
at its position ends, without parsing it. `parse_call` then validates the
complete text with the standard decoder.
"""

from __future__ import annotations

import json
from typing import Any

_WHITESPACE = " \t\n\r"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# NaN and Infinity are not JSON: a call carrying them is not a valid call.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


class NotJson(ValueError):
    """The text cannot be the JSON value expected there."""


class JsonValueEnd:
    """Finds the end of the object or array that starts at (or after whitespace from) `start`."""

    def __init__(self, start: int, openers: str = "{[") -> None:
        self._pos = start
        self._openers = openers
        self._depth = 0
        self._in_string = False
        self._escape = False
        self.value_start: int | None = None

    def scan(self, buf: str) -> int | None:
        """The index just past the value once it is complete in `buf` (which only ever grows); else None.

        NotJson when the first character after whitespace is not an allowed opener.
        """
        pos, depth = self._pos, self._depth
        in_string, escape = self._in_string, self._escape
        end: int | None = None
        while pos < len(buf):
            char = buf[pos]
            pos += 1
            if self.value_start is None:
                if char in _WHITESPACE:
                    continue
                if char not in self._openers:
                    raise NotJson(f"expected one of {self._openers!r}, got {char!r}")
                self.value_start, depth = pos - 1, 1
            elif in_string:
                if escape:
                    escape = False
                elif char == "\\":
                    escape = True
                elif char == '"':
                    in_string = False
            elif char == '"':
                in_string = True
            elif char in "{[":
                depth += 1
            elif char in "}]":
                depth -= 1
                if depth == 0:
                    end = pos
                    break
        self._pos, self._depth, self._in_string, self._escape = pos, depth, in_string, escape
        return end


def skip_whitespace(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _WHITESPACE:
        pos += 1
    return pos


def object_members(text: str) -> dict[str, tuple[Any, str]]:
    """A JSON object's members: key -> (value, the value's own text). NotJson if `text` is not one object."""
    pos = skip_whitespace(text, 0)
    if not text.startswith("{", pos):
        raise NotJson("not a JSON object")
    members: dict[str, tuple[Any, str]] = {}
    pos = skip_whitespace(text, pos + 1)
    if text.startswith("}", pos):
        pos += 1
    else:
        while True:
            try:
                key, pos = _DECODER.raw_decode(text, pos)
                pos = skip_whitespace(text, pos)
                if not isinstance(key, str) or not text.startswith(":", pos):
                    raise NotJson("expected a string key and ':'")
                value_start = skip_whitespace(text, pos + 1)
                value, pos = _DECODER.raw_decode(text, value_start)
            except ValueError as exc:  # JSONDecodeError, or NaN/Infinity
                raise NotJson(str(exc)) from None
            members[key] = (value, text[value_start:pos])
            pos = skip_whitespace(text, pos)
            if text.startswith(",", pos):
                pos = skip_whitespace(text, pos + 1)
                continue
            if text.startswith("}", pos):
                pos += 1
                break
            raise NotJson("expected ',' or '}'")
    if skip_whitespace(text, pos) != len(text):
        raise NotJson("text after the object")
    return members


def parse_call(text: str, argument_keys: tuple[str, ...] = ("arguments", "parameters")) -> tuple[str, str] | None:
    """(name, arguments JSON object text) of a call object, or None when it is not a valid call.

    The arguments keep the model's own text when it is a JSON object; a string that
    holds a JSON object (some models quote their arguments) is unwrapped; no arguments
    at all means `{}`.
    """
    try:
        members = object_members(text)
    except NotJson:
        return None
    name = members.get("name", (None, ""))[0]
    if not isinstance(name, str) or not name:
        return None
    found = [members[key] for key in argument_keys if key in members]
    if not found:
        return name, "{}"
    value, raw = found[0]
    if isinstance(value, dict):
        return name, raw
    if isinstance(value, str):
        try:
            inner = _DECODER.decode(value)
        except ValueError:
            return None
        return (name, value) if isinstance(inner, dict) else None
    return None
