"""GrowingText: a sample's text grown a piece at a time, read whenever an API needs it."""

from __future__ import annotations

from gateway.growing_text import GrowingText


def test_the_text_is_its_pieces_in_order_at_every_read() -> None:
    text = GrowingText()
    assert text.value() == ""
    expected = ""
    for piece in ["Hel", "", "lo", " wörld", "\n", "!"]:
        text.add(piece)
        expected += piece
        assert text.value() == expected


def test_a_read_with_nothing_added_since_gives_the_same_string() -> None:
    # /generate's cumulative events tell "unchanged" from "grew" by identity (cumulative_json.py).
    text = GrowingText()
    text.add("a")
    text.add("b")
    first = text.value()
    assert text.value() is first
    text.add("")
    assert text.value() is first
    text.add("c")
    assert text.value() == "abc"


def test_pieces_are_kept_until_read_not_copied_per_piece() -> None:
    # The point of it: adding holds the piece; only a read joins (once), so n pieces cost O(n) in all.
    text = GrowingText()
    pieces = [f"t{i}" for i in range(10_000)]
    for piece in pieces:
        text.add(piece)
    assert len(text._pieces) == 10_000
    assert text.value() == "".join(pieces)
    assert len(text._pieces) == 1
