"""Constraint -> xgrammar.CompiledGrammar. Runs inside a compile worker process (compile_worker.py).

A grammar whose language is empty (no token can start it: a rule defined only by itself, a
`$ref` loop through `allOf`, ...) is refused here, at compile time, with a 400, instead of
becoming an abort at the first sampled token.
"""

from __future__ import annotations

import json
import re
from typing import Any

from services.engine.grammar.constraint import Constraint, choice_grammar
from turnout.errors import InvalidArgument

# xgrammar prefixes its C++ errors with "[hh:mm:ss] /path/file.cc:123: " and sometimes "Check failed: (...) is false: ".
_CPP_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: \(.*?\) is false: )?")


def xgrammar_reason(exc: BaseException) -> str:
    """xgrammar's message without its C++ source location."""
    text = str(exc).strip()
    return _CPP_PREFIX.sub("", text).strip() or type(exc).__name__


def build(compiler: Any, c: Constraint) -> Any:
    """Compile with `compiler` (an xgrammar.GrammarCompiler); InvalidArgument when it matches nothing."""
    compiled = _compile(compiler, c)
    _check_not_empty(compiled, c)
    return compiled


def _compile(compiler: Any, c: Constraint) -> Any:
    if c.is_json:
        schema = c.text if c.kind == "json_schema" else '{"type": "object"}'
        if c.compact:
            return compiler.compile_json_schema(schema, any_whitespace=False, separators=(",", ":"))
        return compiler.compile_json_schema(schema, any_whitespace=True, max_whitespace_cnt=c.max_whitespace)
    if c.kind == "regex":
        return compiler.compile_regex(c.text)
    if c.kind == "ebnf":
        return compiler.compile_grammar(c.text)
    if c.kind == "choice":
        return compiler.compile_grammar(choice_grammar(c.choices))
    return _structural_tag(compiler, c.text)


def _check_not_empty(compiled: Any, c: Constraint) -> None:
    import xgrammar as xgr

    matcher = xgr.GrammarMatcher(compiled)
    bitmask = xgr.allocate_token_bitmask(1, compiled.tokenizer_info.vocab_size)
    matcher.fill_next_token_bitmask(bitmask)
    if not bool(bitmask.ne(0).any()):
        raise InvalidArgument(
            f"{c.kind}: the constraint matches no output at all (no token can start it); a $ref or rule "
            "defined only through itself does this"
        )


def _structural_tag(compiler: Any, text: str) -> Any:
    """SGLang's legacy form {"type": "structural_tag", "structures": [{begin, schema, end}], "triggers": [...]},
    or xgrammar's own {"type": "structural_tag", "format": {...}}."""
    import xgrammar as xgr

    try:
        tag = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"structural_tag: not valid JSON: {exc}") from None
    if not isinstance(tag, dict):
        raise InvalidArgument("structural_tag must be a JSON object")
    if "structures" not in tag:
        return compiler.compile_structural_tag(text)
    structures, triggers = tag.get("structures"), tag.get("triggers")
    if not isinstance(structures, list) or not isinstance(triggers, list) or not triggers:
        raise InvalidArgument("structural_tag: `structures` and `triggers` must be non-empty lists")
    items = []
    for i, s in enumerate(structures):
        if not isinstance(s, dict) or not {"begin", "end"} <= s.keys():
            raise InvalidArgument(f"structural_tag: structures[{i}] needs `begin`, `schema` and `end`")
        schema = s.get("schema", s.get("parameters"))
        if schema is None:
            raise InvalidArgument(f"structural_tag: structures[{i}] needs `begin`, `schema` and `end`")
        items.append(xgr.StructuralTagItem(begin=s["begin"], schema=schema, end=s["end"]))
    return compiler.compile_structural_tag(items, triggers)
