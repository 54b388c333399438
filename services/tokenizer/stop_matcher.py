"""Stop strings and stop regexes matched on streamed text, holding back what could be a stop's start.

Invariant: text is emitted only up to the earliest index where a stop could
still begin once more text arrives (a suffix that is a proper prefix of a stop
string, or a partial regex match), so every match lies wholly inside text that
has not been emitted yet and no emitted text is ever retracted.

The window searched on each push:

    _text:  [ context ........ | held .................. ] + delta
             `- emitted, kept   `- _pos: not yet emitted
                for lookbehind

A match counts as soon as it is complete in the text so far (the earliest
start wins; a stop string wins a tie), as in SGLang and vLLM, which check after
every token. When the sequence ends, the final text is searched once more with
its real end, so `$`-anchored regexes can match there.

Hold-back bound: a regex such as `.*x` partially matches any line, so the text
held for regexes is capped at `max_regex_hold` characters (1024 by default);
past that the oldest held text is released. A regex match up to that length is
always found; a longer one is missed, or (for patterns that may start anywhere,
like `.*x`) found starting at most `max_regex_hold` characters back. SGLang
instead re-searches the whole output after every token without holding back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.tokenizer.stop_regex import StopRegex, compile_stop_regex

MAX_REGEX_HOLD_CHARS = 1024
# Emitted text kept in front of the held text for lookbehind, `\b` and `(?m)^`.
REGEX_CONTEXT_CHARS = 256


@dataclass(slots=True)
class StopResult:
    """Text that became final, and the stop string or stop regex that ended the sequence, if any.
    One per step of every sequence: slotted, not frozen (a frozen dataclass costs ~3x to build)."""

    text: str
    matched_stop: str | None = None
    matched_regex: str | None = None

    @property
    def stopped(self) -> bool:
        return self.matched_stop is not None or self.matched_regex is not None


@dataclass(frozen=True)
class _Match:
    start: int
    end: int
    stop: str | None = None
    regex: str | None = None


class StopMatcher:
    def __init__(
        self,
        stops: Sequence[str],
        *,
        regexes: Sequence[str] = (),
        keep_stop: bool = False,
        max_regex_hold: int = MAX_REGEX_HOLD_CHARS,
    ) -> None:
        """Raises InvalidArgument for a regex that does not compile or can match the empty string."""
        self._stops = [s for s in dict.fromkeys(stops) if s]
        self._regexes: list[StopRegex] = [compile_stop_regex(p) for p in dict.fromkeys(regexes)]
        self._keep_stop = keep_stop
        self._max_regex_hold = max_regex_hold
        self._text = ""
        self._pos = 0
        self._ended = False

    def push(self, delta: str, *, last: bool = False) -> StopResult:
        """Add a text delta; return what can be emitted and which stop matched, if one did.

        With `last` the sequence ends: the held text is released unless a stop matches.
        """
        if self._ended:
            raise RuntimeError("the sequence is over (a stop matched or the last delta was pushed)")
        text, pos = self._text + delta, self._pos
        match = self._earliest_match(text, pos, at_end=last)
        if match is not None:
            self._end()
            end = match.end if self._keep_stop else match.start
            return StopResult(text[pos:end], match.stop, match.regex)
        if last:
            self._end()
            return StopResult(text[pos:])
        hold = self._hold_from(text, pos)
        keep_from = max(0, hold - REGEX_CONTEXT_CHARS) if self._regexes else hold
        self._text, self._pos = text[keep_from:], hold - keep_from
        return StopResult(text[pos:hold])

    def flush(self) -> StopResult:
        """The sequence ended: check the final text once more, then release what is held."""
        return self.push("", last=True)

    def _end(self) -> None:
        self._ended = True
        self._text, self._pos = "", 0

    def _earliest_match(self, text: str, pos: int, *, at_end: bool) -> _Match | None:
        best: _Match | None = None
        for stop in self._stops:
            index = text.find(stop, pos)
            if index != -1 and (best is None or index < best.start):
                best = _Match(index, index + len(stop), stop=stop)
        for stop_regex in self._regexes:
            span = stop_regex.find(text, pos, at_end=at_end)
            if span is not None and (best is None or span[0] < best.start):
                best = _Match(*span, regex=stop_regex.pattern)
        return best

    def _hold_from(self, text: str, pos: int) -> int:
        """Index from which text must be held back: the earliest place a stop may still begin."""
        hold = len(text) - self._longest_stop_prefix_suffix(text[pos:])
        if self._regexes:
            starts = [s for r in self._regexes if (s := r.hold_from(text, pos)) is not None]
            if starts:
                hold = min(hold, max(min(starts), len(text) - self._max_regex_hold))
        return hold

    def _longest_stop_prefix_suffix(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        longest = 0
        for stop in self._stops:
            for length in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:length]):
                    longest = length
                    break
        return longest
