"""Stop regexes: validated once, then searched on text that is still growing.

Patterns are Python `re` syntax, compiled with the third-party `regex` module,
whose `partial=True` search says where a match could still begin once more
text arrives (what the stop matcher must hold back).

Streamed text is searched as if more text follows, unless the sequence has
ended: a match counts only if a match at the same start exists whatever comes
next. We approximate "whatever" by two probe continuations, one word and one
non-word character, so `abc$`, `\\d+\\b` or `\\bword\\b` wait for the next
character (or the end of the sequence) instead of matching at a chunk
boundary. Greedy tails are not waited for: `\\d+` matches the digits that have
arrived, as SGLang's check after every token does.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import regex

from turnout.errors import InvalidArgument

try:  # the stdlib parser gives a pattern's width range
    import re._parser as _sre_parse  # type: ignore[import-not-found]
except ImportError:  # Python 3.10
    import sre_parse as _sre_parse

# Continuations tried after text that is not final: a letter (for \b, \w) and a
# noncharacter that no class but `.`/negated classes matches (for \B, \W, $).
_PROBES = ("\u02b0", "\ufdd0")
# A search that runs longer than this (catastrophic backtracking) fails the
# stream rather than stall the event loop that serves every other one.
SEARCH_TIMEOUT_S = 0.5


@dataclass(frozen=True)
class StopRegex:
    pattern: str
    compiled: regex.Pattern[str]

    def find(self, text: str, pos: int, *, at_end: bool) -> tuple[int, int] | None:
        """Span of the leftmost certain match starting at or after `pos`.

        `text[:pos]` is context only (lookbehind, `\\b`, `(?m)^`); `^` and `\\A`
        do not match at `pos` unless it is 0. Unless `at_end`, text follows.
        """
        while (match := self._search(text, pos)) is not None:
            start, end = match.span()
            if end > start and (at_end or self._certain(text, start)):
                return start, end
            pos = start + 1
        return None

    def hold_from(self, text: str, pos: int) -> int | None:
        """Earliest index >= `pos` where a match may still start once text is added."""
        match = self._search(text, pos, partial=True)
        return None if match is None else match.start()

    def _certain(self, text: str, start: int) -> bool:
        return all(self._search(text + probe, start, anchored=True) is not None for probe in _PROBES)

    def _search(self, text: str, pos: int, *, partial: bool = False, anchored: bool = False) -> regex.Match[str] | None:
        method = self.compiled.match if anchored else self.compiled.search
        try:
            return method(text, pos, partial=partial, timeout=SEARCH_TIMEOUT_S)
        except TimeoutError:
            raise InvalidArgument(
                f"stop_regex {self.pattern!r} took over {SEARCH_TIMEOUT_S}s on {len(text) - pos} characters; "
                "simplify the pattern"
            ) from None


@functools.lru_cache(maxsize=256)
def compile_stop_regex(pattern: str) -> StopRegex:
    """Compile and validate one pattern; InvalidArgument says what is wrong with it."""
    try:
        compiled = regex.compile(pattern)
    except regex.error as exc:
        raise InvalidArgument(f"stop_regex {pattern!r} is not a valid regular expression: {exc}") from None
    if _can_match_empty(pattern, compiled):
        raise InvalidArgument(
            f"stop_regex {pattern!r} matches the empty string, so it would stop the sequence at once; "
            "make it match at least one character"
        )
    return StopRegex(pattern, compiled)


def _can_match_empty(pattern: str, compiled: regex.Pattern[str]) -> bool:
    """Whether any match can be zero characters long (`a*`, `$`, `\\b`, `(?=x)`)."""
    try:
        return bool(_sre_parse.parse(pattern).getwidth()[0] == 0)
    except (re.error, OverflowError, RecursionError):
        # Syntax only `regex` knows (`\p{L}`, ...): fall back to the empty text itself.
        return compiled.search("") is not None
