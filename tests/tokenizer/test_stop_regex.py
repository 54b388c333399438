from __future__ import annotations

import random

import pytest

from services.tokenizer import stop_regex
from services.tokenizer.stop_matcher import StopMatcher, StopResult
from turnout.errors import InvalidArgument


def feed(matcher: StopMatcher, deltas: list[str]) -> StopResult:
    """All emitted text, and what ended it; the sequence ends after the deltas."""
    out = []
    for delta in deltas:
        result = matcher.push(delta)
        out.append(result.text)
        if result.stopped:
            return StopResult("".join(out), result.matched_stop, result.matched_regex)
    end = matcher.flush()
    return StopResult("".join(out) + end.text, end.matched_stop, end.matched_regex)


def test_regex_across_chunk_boundaries_is_trimmed_at_its_start() -> None:
    matcher = StopMatcher([], regexes=[r"\d{3}"])
    assert matcher.push("ab1") == StopResult("ab")  # "1" may start a match: held
    assert matcher.push("2") == StopResult("")
    assert matcher.push("x34") == StopResult("12x")  # "12x" can no longer match: released
    assert matcher.push("5 tail") == StopResult("", matched_regex=r"\d{3}")


def test_partial_match_is_held_back_then_released() -> None:
    matcher = StopMatcher([], regexes=[r"\d+ apples"])
    assert matcher.push("I have 4") == StopResult("I have ")
    assert matcher.push("2 ap") == StopResult("")
    assert matcher.push("ricots") == StopResult("42 apricots")


def test_no_stop_trim_keeps_the_matched_text() -> None:
    deltas = ["The answer is 4", "2. Done"]
    assert feed(StopMatcher([], regexes=[r"\d+\."]), deltas) == StopResult("The answer is ", None, r"\d+\.")
    kept = feed(StopMatcher([], regexes=[r"\d+\."], keep_stop=True), deltas)
    assert kept == StopResult("The answer is 42.", None, r"\d+\.")


@pytest.mark.parametrize(
    ("stops", "regexes", "expected"),
    [
        (["world"], [r"l+o"], StopResult("he", None, r"l+o")),  # the regex starts first
        (["ell"], [r"l+o"], StopResult("h", "ell", None)),  # the string starts first
        (["llo"], [r"l+o"], StopResult("he", "llo", None)),  # a tie goes to the string
    ],
)
def test_earliest_start_wins_between_strings_and_regexes(
    stops: list[str], regexes: list[str], expected: StopResult
) -> None:
    assert feed(StopMatcher(stops, regexes=regexes), ["hello world"]) == expected


@pytest.mark.parametrize("pattern", ["a*", "$", r"\b", "(?=x)", "", "x?", r"\p{L}*"])
def test_patterns_that_match_the_empty_string_are_refused(pattern: str) -> None:
    with pytest.raises(InvalidArgument, match="matches the empty string") as info:
        StopMatcher([], regexes=["ok", pattern])
    assert repr(pattern) in str(info.value)


@pytest.mark.parametrize(("pattern", "error"), [("(ab", "missing )"), ("[a-", "unterminated character set")])
def test_invalid_patterns_are_refused_naming_pattern_and_error(pattern: str, error: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        StopMatcher([], regexes=[pattern])
    assert repr(pattern) in str(info.value)
    assert error in str(info.value)


def test_end_anchored_regex_matches_only_the_final_text() -> None:
    # Mid-stream, "end" at a chunk boundary is not the end of the sequence.
    assert feed(StopMatcher([], regexes=["end$"]), ["the end", " is near"]) == StopResult("the end is near")
    matcher = StopMatcher([], regexes=["end$"], keep_stop=True)
    assert matcher.push("the end") == StopResult("the ")
    assert matcher.flush() == StopResult("end", None, "end$")


def test_held_partial_match_is_released_when_the_sequence_ends() -> None:
    matcher = StopMatcher([], regexes=["abcd"])
    assert matcher.push("xyz abc") == StopResult("xyz ")
    assert matcher.push("", last=True) == StopResult("abc")


def test_word_boundary_at_a_chunk_edge_waits_for_the_next_character() -> None:
    assert feed(StopMatcher([], regexes=[r"\bcat\b"]), ["a cat", "alog"]) == StopResult("a catalog")
    assert feed(StopMatcher([], regexes=[r"\bcat\b"]), ["a cat", " sat"]) == StopResult("a ", None, r"\bcat\b")


def test_greedy_tail_matches_what_has_arrived() -> None:
    # Like SGLang's check after every token: `.+` does not wait for the rest of the line.
    matcher = StopMatcher([], regexes=["Answer: .+"], keep_stop=True)
    assert matcher.push("so. Answer: 4") == StopResult("so. Answer: 4", None, "Answer: .+")


def test_anchors_and_lookbehind_see_already_emitted_text() -> None:
    assert feed(StopMatcher([], regexes=["^ab"]), ["zz", "ab"]) == StopResult("zzab")
    assert feed(StopMatcher([], regexes=["^ab"]), ["a", "b"]) == StopResult("", None, "^ab")
    assert feed(StopMatcher([], regexes=["(?m)^Done"]), ["one\n", "Done"]) == StopResult("one\n", None, "(?m)^Done")
    assert feed(StopMatcher([], regexes=[r"(?<=\$)\d+"]), ["cost: $", "12"]) == StopResult(
        "cost: $", None, r"(?<=\$)\d+"
    )
    assert feed(StopMatcher([], regexes=[r"(?<=\$)\d+"]), ["cost: ", "12"]) == StopResult("cost: 12")


def test_hold_back_is_bounded_for_patterns_that_match_anything() -> None:
    matcher = StopMatcher([], regexes=[".*x"], max_regex_hold=10)
    assert matcher.push("a" * 25) == StopResult("a" * 15)  # only the last 10 characters stay held
    assert matcher.push("b" * 5) == StopResult("a" * 5)
    # The match starts where the held text starts: at most 10 characters back.
    assert matcher.push("x tail") == StopResult("", None, ".*x")


def test_long_stop_string_is_not_cut_by_the_regex_bound() -> None:
    stop = "0123456789ABCDEF"
    matcher = StopMatcher([stop], regexes=[".*z"], max_regex_hold=4)
    assert matcher.push("xx" + stop[:12]) == StopResult("xx")
    assert matcher.push(stop[12:]) == StopResult("", stop, None)


@pytest.mark.parametrize("seed", range(20))
def test_random_chunking_never_retracts_and_finds_the_first_match(seed: int) -> None:
    rng = random.Random(seed)
    text = "".join(rng.choice("ab12 c3x") for _ in range(40))
    regexes = [r"\d{3}", r"[ab]{2}c"]  # both fixed width: the first to complete is the leftmost
    whole = StopMatcher([], regexes=regexes).push(text, last=True)
    matcher = StopMatcher([], regexes=regexes)
    emitted, position, result = "", 0, StopResult("")
    while position < len(text) and not result.stopped:
        step = rng.randint(1, 5)
        result = matcher.push(text[position : position + step])
        position += step
        emitted += result.text
        assert text.startswith(emitted)  # nothing emitted is ever taken back
    if not result.stopped:
        result = matcher.flush()
        emitted += result.text
    assert (emitted, result.matched_regex) == (whole.text, whole.matched_regex)


def test_catastrophic_backtracking_fails_the_stream_instead_of_stalling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stop_regex, "SEARCH_TIMEOUT_S", 0.05)
    matcher = StopMatcher([], regexes=[r"(a|aa)+c"])
    with pytest.raises(InvalidArgument, match=r"stop_regex '\(a\|aa\)\+c' took over 0.05s"):
        matcher.push("a" * 60 + "b")
