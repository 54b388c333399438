"""Compiling constraints to xgrammar grammars: one compiler per engine, a cache, a thread pool.

Compilation runs off the step loop: `submit()` hands the work to a small thread pool and
returns a future, which the gRPC path awaits before giving the request to the step loop, so
a slow grammar delays only its own request. The cache maps each distinct constraint (kind,
text, whitespace options) to the future of its compiled grammar, so concurrent requests with
the same constraint share one compilation; failures are cached too (the same bad schema is
refused again without recompiling). xgrammar's own compiler caches JSON schemas and EBNF as
well; ours also covers regexes, choices and structural tags and counts real compilations.

`build` is injectable: tests wrap the xgrammar one to hold a compilation in flight.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from services.engine.grammar.constraint import Constraint, choice_grammar
from services.engine.vocab import ModelVocab
from turnout.errors import InvalidArgument, TurnoutError

log = logging.getLogger(__name__)

# xgrammar prefixes its C++ errors with "[hh:mm:ss] /path/file.cc:123: " and sometimes "Check failed: (...) is false: ".
_CPP_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: (Check failed: \(.*?\) is false: )?")

Build = Callable[[Constraint], Any]  # Constraint -> xgrammar.CompiledGrammar


def xgrammar_reason(exc: BaseException) -> str:
    """xgrammar's message without its C++ source location."""
    text = str(exc).strip()
    return _CPP_PREFIX.sub("", text).strip() or type(exc).__name__


class GrammarCompiler:
    def __init__(
        self, vocab: ModelVocab, *, build: Build | None = None, max_cached: int = 512, threads: int = 2
    ) -> None:
        self.vocab = vocab
        self._build = build or self.build_with_xgrammar
        self._xgr: Any = None
        self._max_cached = max_cached
        self._cache: OrderedDict[Constraint, Future[Any]] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="grammar-compile")
        # Compilations started (cache misses); a cache hit leaves it unchanged.
        self.num_compiled = 0

    def submit(self, constraint: Constraint) -> Future[Any]:
        """The compiled grammar's future; it raises InvalidArgument when the constraint does not compile."""
        with self._lock:
            future = self._cache.get(constraint)
            if future is not None:
                self._cache.move_to_end(constraint)
                return future
            future = self._pool.submit(self._compile, constraint)
            self.num_compiled += 1
            self._cache[constraint] = future
            while len(self._cache) > self._max_cached:
                self._cache.popitem(last=False)
            return future

    def compile(self, constraint: Constraint) -> Any:
        """Blocking compile (offline API, tests); raises InvalidArgument."""
        return self.submit(constraint).result()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _compile(self, constraint: Constraint) -> Any:
        try:
            return self._build(constraint)
        except TurnoutError:
            raise
        except Exception as exc:
            raise InvalidArgument(
                f"{constraint.kind}: the constraint does not compile: {xgrammar_reason(exc)}"
            ) from None

    # -- the xgrammar backend ---------------------------------------------------

    def build_with_xgrammar(self, c: Constraint) -> Any:
        import xgrammar as xgr

        if self._xgr is None:
            self._xgr = xgr.GrammarCompiler(self.vocab.tokenizer_info, max_threads=2)
        compiler = self._xgr
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
        return self._structural_tag(compiler, c.text)

    @staticmethod
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
