"""A structured-output constraint as the engine keeps it: what to compile, and the compile cache's key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ConstraintKind = Literal["json_schema", "json_object", "regex", "ebnf", "structural_tag", "choice"]
KINDS: tuple[ConstraintKind, ...] = ("json_schema", "json_object", "regex", "ebnf", "structural_tag", "choice")


@dataclass(frozen=True)
class Constraint:
    kind: ConstraintKind
    # The schema / pattern / grammar / tag JSON; empty for json_object.
    text: str = ""
    # For choice: the strings, exactly one of which the output must be.
    choices: tuple[str, ...] = ()
    # JSON kinds only: no whitespace at all between JSON tokens (compact output).
    compact: bool = False
    # JSON kinds only: longest run of whitespace allowed between JSON tokens (None: unbounded).
    max_whitespace: int | None = None

    @property
    def is_json(self) -> bool:
        return self.kind in ("json_schema", "json_object")


def ebnf_literal(text: str) -> str:
    """`text` as a double-quoted EBNF string literal that matches exactly it (escapes quotes,
    backslashes and control characters, so a choice can never inject grammar syntax)."""
    out = []
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(f"\\u{ord(ch):04x}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'


def choice_grammar(choices: tuple[str, ...]) -> str:
    """EBNF whose language is exactly the given strings."""
    return "root ::= " + " | ".join(ebnf_literal(c) for c in choices)
