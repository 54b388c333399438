from __future__ import annotations

import pytest

from services.tokenizer.stop_matcher import StopMatcher, StopResult


def feed(matcher: StopMatcher, deltas: list[str]) -> tuple[str, str | None]:
    """All emitted text and the stop string that ended it (the sequence ends after the deltas)."""
    out = []
    for delta in deltas:
        result = matcher.push(delta)
        out.append(result.text)
        if result.stopped:
            return "".join(out), result.matched_stop
    end = matcher.flush()
    return "".join(out) + end.text, end.matched_stop


def test_stop_string_across_chunk_boundaries_is_trimmed() -> None:
    assert feed(StopMatcher(["Paris"]), ["The capital is Pa", "r", "is. And"]) == ("The capital is ", "Paris")


def test_possible_stop_prefix_is_held_back_not_emitted() -> None:
    matcher = StopMatcher(["Paris"])
    assert matcher.push("The Pa") == StopResult("The ")
    assert matcher.push("ella") == StopResult("Paella")  # not a stop after all: released


def test_held_text_is_released_when_the_sequence_ends() -> None:
    matcher = StopMatcher(["STOP"])
    assert matcher.push("go ST") == StopResult("go ")
    assert matcher.flush() == StopResult("ST")


def test_keep_stop_includes_the_stop_string() -> None:
    assert feed(StopMatcher(["</a>"], keep_stop=True), ["x </", "a> tail"]) == ("x </a>", "</a>")


def test_earliest_match_wins_among_several_stops() -> None:
    assert feed(StopMatcher(["world", "lo"]), ["hello world"]) == ("hel", "lo")


def test_without_stops_nothing_is_held() -> None:
    matcher = StopMatcher([])
    assert matcher.push("abc") == StopResult("abc")
    assert matcher.flush() == StopResult("")


def test_stop_inside_a_single_delta_drops_the_rest() -> None:
    assert feed(StopMatcher(["\n\n"]), ["line one\n\nline two"]) == ("line one", "\n\n")


def test_pushing_after_a_match_or_the_end_is_an_error() -> None:
    matcher = StopMatcher(["x"])
    assert matcher.push("x").matched_stop == "x"
    with pytest.raises(RuntimeError):
        matcher.push("y")
    ended = StopMatcher(["x"])
    ended.flush()
    with pytest.raises(RuntimeError):
        ended.push("y")
