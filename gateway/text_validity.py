"""Refusing request bodies whose text is not valid Unicode, before anything reads a field.

JSON may carry lone UTF-16 surrogates (`"\\ud800"`), and Python's `json` decodes
them (and raw UTF-8-encoded surrogates, decoded with `surrogatepass`) into
strings that cannot be encoded again: every later step that encodes text (a
protobuf field, a log line, an error body, the tokenizer) would fail. One walk
over the parsed body finds the first such string, in a key or a value, and the
request is answered 400 naming where it is (`messages[0].content`), as the
gRPC edge does for invalid UTF-8 (`turnout/request_decoding.py`).
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import Request

from gateway.errors import invalid_request

_SURROGATE = re.compile("[\ud800-\udfff]")
# What JSON parses to besides strings, objects and arrays: nothing in them can be invalid text.
_SCALARS = frozenset({int, float, bool, type(None)})


def invalid_text_path(value: Any, path: str = "") -> str | None:
    """Where in a parsed JSON value the first string with a lone surrogate is ('' for the value itself);
    None if every string is valid Unicode."""
    # Iterative, so a deeply nested body cannot exhaust the stack.
    pending: list[tuple[str, Any]] = [(path, value)]
    while pending:
        where, item = pending.pop()
        if isinstance(item, str):
            if not item.isascii() and _SURROGATE.search(item):
                return where
        elif isinstance(item, dict):
            children: list[tuple[str, Any]] = []
            for key, child in item.items():
                if not key.isascii() and _SURROGATE.search(key):
                    return f"{where}.<key>" if where else "<key>"  # the key itself is invalid: no name to show
                children.append((f"{where}.{key}" if where else key, child))
            pending.extend(reversed(children))
        elif isinstance(item, list):
            # Only strings and containers can hold text. A list of numbers (token ids) is passed over in C,
            # not given a path string per element (a 2,000-id prompt: ~0.8 ms a request before).
            if _SCALARS.issuperset(map(type, item)):
                continue
            texts = [(i, child) for i, child in enumerate(item) if isinstance(child, (str, dict, list))]
            pending.extend((f"{where}[{i}]", child) for i, child in reversed(texts))
    return None


async def refuse_invalid_text(request: Request) -> None:
    """An app-wide dependency: 400 for a JSON body with invalid Unicode anywhere.

    Runs after FastAPI parsed the body (the parse is cached on the request, so this reads
    no byte twice) and before the body is validated into the route's model."""
    if request.method not in ("POST", "PUT", "PATCH"):
        return
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError):
        return  # not JSON: the route's own validation answers it
    where = invalid_text_path(body)
    if where is not None:
        name = where or "the request body"
        raise invalid_request(
            f"'{name}' is not valid Unicode text (it contains a lone UTF-16 surrogate such as \\ud800)", where or None
        )
