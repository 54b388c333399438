"""Counting output tokens that fall inside the thinking block.

The text parser sees text after stop-string matching, which no longer lines up
with tokens; so a second parser of the same kind is fed each token's own text
as it is detokenized. A token counts when the parser was inside a block before
it, is inside after it, or the token completed a close tag. Tokens that only
might start a block (a start tag split over several tokens) wait, and count
once the block opens.
"""

from __future__ import annotations

from services.tokenizer.reasoning.base import ReasoningParser


class ReasoningTokenCounter:
    def __init__(self, parser: ReasoningParser) -> None:
        self._parser = parser
        self._pending = 0
        self.count = 0

    def add(self, text: str, tokens: int = 1) -> None:
        """One token's text (or `tokens` tokens' text together)."""
        parser = self._parser
        was_inside, closed = parser.inside, parser.blocks_closed
        parser.feed(text)
        if was_inside or parser.inside or parser.blocks_closed > closed:
            self.count += tokens + (0 if was_inside else self._pending)
            self._pending = 0
        elif parser.undecided:
            self._pending += tokens
        else:
            self._pending = 0
