"""Stop strings matched on streamed text, holding back what could be a stop's start.

Invariant: the held text `_held` is never emitted while a suffix of it is a
proper prefix of some stop string, so every match lies wholly inside text that
has not been emitted yet and no emitted text is ever retracted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StopResult:
    """Text that became final, and the stop string that ended the sequence, if any."""

    text: str
    matched: str | None = None


class StopMatcher:
    def __init__(self, stops: Sequence[str], *, keep_stop: bool = False) -> None:
        self._stops = [s for s in dict.fromkeys(stops) if s]
        self._keep_stop = keep_stop
        self._held = ""
        self.matched: str | None = None

    def push(self, delta: str) -> StopResult:
        """Add a text delta; return what can be emitted and whether a stop matched."""
        if self.matched is not None:
            raise RuntimeError("stop string already matched; the sequence is over")
        text = self._held + delta
        match = self._earliest_match(text)
        if match is not None:
            start, stop = match
            self.matched = stop
            self._held = ""
            end = start + len(stop) if self._keep_stop else start
            return StopResult(text[:end], stop)
        hold = self._longest_stop_prefix_suffix(text)
        self._held = text[len(text) - hold :]
        return StopResult(text[: len(text) - hold])

    def flush(self) -> str:
        """The sequence ended without a match: release the held text."""
        held, self._held = self._held, ""
        return held

    def _earliest_match(self, text: str) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for stop in self._stops:
            index = text.find(stop)
            if index != -1 and (best is None or index < best[0]):
                best = (index, stop)
        return best

    def _longest_stop_prefix_suffix(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
        longest = 0
        for stop in self._stops:
            for length in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:length]):
                    longest = length
                    break
        return longest
