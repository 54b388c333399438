"""One sequence's grammar state: an xgrammar matcher over the request's compiled grammar.

Every sample of a request has its own (forked samples start fresh: they fork before their
first token). The matcher advances only on tokens the engine keeps, so a preempted sequence
that is recomputed keeps its state with its tokens.
"""

from __future__ import annotations

from typing import Any


class GrammarState:
    def __init__(self, compiled: Any, stop_token_ids: frozenset[int]) -> None:
        import xgrammar as xgr

        self.compiled = compiled
        self.stop_token_ids = stop_token_ids
        # The engine's EOS ids are the grammar's stop tokens: EOS is allowed only where the grammar
        # may end. Without any, the matcher terminates as soon as the grammar is complete.
        self.matcher = xgr.GrammarMatcher(
            compiled,
            override_stop_tokens=sorted(stop_token_ids) or None,
            terminate_without_stop_token=not stop_token_ids,
        )

    def fresh(self) -> GrammarState:
        """A new matcher at the grammar's start, for another sample of the same request."""
        return GrammarState(self.compiled, self.stop_token_ids)

    def accept(self, token_id: int) -> bool:
        """Advance over a sampled token; False when the grammar does not allow it."""
        return bool(self.matcher.accept_token(token_id))

    @property
    def terminated(self) -> bool:
        """Accepted its stop token (or, without stop tokens, completed): the output is done."""
        return bool(self.matcher.is_terminated())
