"""Bounds on a structured-output constraint, checked before anything compiles it.

- Size: the constraint's UTF-8 bytes (a choice: all its strings together) at most
  --max-grammar-bytes.
- Depth (JSON schema, structural tag): nesting of objects and arrays in the JSON text at most
  --max-grammar-depth. Measured by one scan over the text's brackets and strings, without
  parsing or recursion, so a 100,000-deep `[[[[` is refused in linear time (json.loads would
  raise RecursionError on it, and xgrammar's compile time grows steeply with depth).
- `$ref` (and `$dynamicRef`, `$recursiveRef`): only pointers into the schema itself (`#` or
  `#/...`). xgrammar fetches nothing and silently ignores references it cannot resolve, so
  `file:///...` or `https://...` would be a constraint quietly lost.
- A `$ref` chain that comes back to where it started without a schema in between
  (`{"$ref": "#"}`, `a -> b -> a`) defines nothing that any output could match: refused.
  Recursion through a real schema (a tree node whose `children` are nodes) is supported:
  xgrammar compiles it to a recursive rule, in time bounded like any other compile
  (--grammar-compile-timeout).

Regex and EBNF nesting is left to xgrammar's parser, which refuses deep nesting quickly.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from services.engine.config import EngineConfig
from services.engine.grammar.constraint import Constraint
from turnout.errors import InvalidArgument

_REF_KEYS = ("$ref", "$dynamicRef", "$recursiveRef")
# Keywords whose values are JSON data, not schemas: a {"$ref": ...} inside them is just data.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
# A JSON string (escapes included) or one bracket; strings are matched whole so brackets in them don't count.
_JSON_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


@dataclass(frozen=True)
class ConstraintLimits:
    max_bytes: int = EngineConfig.max_grammar_bytes
    max_depth: int = EngineConfig.max_grammar_depth


def check_constraint(constraint: Constraint, limits: ConstraintLimits) -> None:
    """Raise InvalidArgument naming the field, the limit and its flag when the constraint is over one."""
    kind = constraint.kind
    size = sum(len(c.encode()) for c in constraint.choices) if kind == "choice" else len(constraint.text.encode())
    if size > limits.max_bytes:
        raise InvalidArgument(
            f"{kind} is {size} bytes; at most {limits.max_bytes} are allowed (the server's --max-grammar-bytes)"
        )
    if kind not in ("json_schema", "structural_tag"):
        return
    depth = json_depth(constraint.text)
    if depth > limits.max_depth:
        raise InvalidArgument(
            f"{kind} nests {depth} levels of objects and arrays; at most {limits.max_depth} are allowed "
            "(the server's --max-grammar-depth)"
        )
    try:
        document = json.loads(constraint.text)
    except (ValueError, RecursionError) as exc:
        raise InvalidArgument(f"{kind} is not valid JSON: {exc}") from None
    refs = _local_refs(kind, document)
    if kind == "json_schema":
        _check_ref_cycles(document, refs)


def json_depth(text: str) -> int:
    """Deepest nesting of objects and arrays in JSON text (`{}` is 1), without parsing it."""
    depth = deepest = 0
    for match in _JSON_TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif token in "]}":
            depth -= 1
    return deepest


def _local_refs(kind: str, document: Any) -> list[tuple[str, str]]:
    """Every reference as (the JSON pointer of the schema holding it, its target pointer), both without
    the leading '#' (the root is ""); InvalidArgument for one that is not local."""
    refs: list[tuple[str, str]] = []
    stack: list[tuple[str, Any]] = [("", document)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, list):
            stack += [(f"{path}/{i}", item) for i, item in enumerate(node)]
            continue
        if not isinstance(node, dict):
            continue
        for key, value in node.items():
            if key in _REF_KEYS and isinstance(value, str):
                if value != "#" and not value.startswith("#/"):
                    raise InvalidArgument(
                        f"{kind}: {key} {value!r} at #{path} is not a local reference; only '#' and "
                        "'#/...' pointers into the schema itself are supported (nothing is fetched)"
                    )
                refs.append((path, value[1:]))
            elif key not in _DATA_KEYWORDS:
                stack.append((f"{path}/{_escape(key)}", value))
    return refs


def _check_ref_cycles(document: Any, refs: list[tuple[str, str]]) -> None:
    """Follow each reference through schemas that are references themselves; coming back is a cycle."""
    for holder, first in refs:
        chain, target = [holder], first
        while True:
            if target in chain:
                shown = " -> ".join(f"#{p}" for p in [*chain, target])
                raise InvalidArgument(
                    f"json_schema: $ref cycle {shown}: each schema on it is only a reference to the next, so "
                    "nothing can match it (a recursive $ref must go through a real schema, e.g. an array's items)"
                )
            chain.append(target)
            node = _resolve(document, target, holder)
            if not (isinstance(node, dict) and isinstance(node.get("$ref"), str) and node["$ref"].startswith("#")):
                break
            target = node["$ref"][1:]


def _resolve(document: Any, pointer: str, holder: str) -> Any:
    node = document
    for raw in pointer.split("/")[1:]:
        part = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise InvalidArgument(f"json_schema: $ref '#{pointer}' at #{holder} points at nothing in the schema")
    return node


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")
