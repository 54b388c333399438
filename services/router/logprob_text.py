"""Fills in the text and bytes of every token in log-probabilities (the engine knows only ids).

A token's text and bytes are a function of its id and the tokenizer alone, so the router keeps each
tokenizer replica's whole table (`TokenTexts`), fetched in one `TokenTexts` call, in the background, the
first time a request asks for logprobs as text: before, every engine message of such a request cost a
`TokenTexts` call, a round trip to the tokenizer for every token it streamed. The table holds the
vocabulary's texts and bytes (a few MB for a 50k vocabulary, ~25 MB for 256k). A replica keeps its
vocabulary while the router runs, as an engine keeps its model: ids would mean other tokens to the engines
otherwise.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Iterator, Sequence

from turnout.v1 import common_pb2, tokenizer_pb2, tokenizer_pb2_grpc

log = logging.getLogger(__name__)

_Table = tuple[Sequence[str], Sequence[bytes]]


class TokenTexts:
    """One tokenizer replica's token table: every id's text and bytes, fetched whole in the background when
    first needed. Until it is here (a fraction of a second; the tokenizer builds it once), and from a
    tokenizer that cannot send it whole (one that predates `whole_vocabulary`), each lookup asks for its
    ids, as before: no request waits for the table."""

    def __init__(self, stub: tokenizer_pb2_grpc.TokenizerStub) -> None:
        self._stub = stub
        self._table: _Table | None = None
        self._whole = True  # whether the tokenizer sends the whole table
        self._fetching: asyncio.Task[None] | None = None

    async def of(self, ids: Iterable[int]) -> dict[int, tuple[str, bytes]]:
        """Each of `ids`' text and bytes. An id outside the vocabulary is the tokenizer's to refuse."""
        wanted = list(dict.fromkeys(ids))
        table = self._table
        if table is None:
            self._fetch_in_background()
        elif all(token_id < len(table[0]) for token_id in wanted):
            texts, raw = table
            return {token_id: (texts[token_id], raw[token_id]) for token_id in wanted}
        # No table yet, or an id past it: the tokenizer answers (or names the id it refuses).
        reply = await self._stub.TokenTexts(tokenizer_pb2.TokenTextsRequest(token_ids=wanted))
        pairs = zip(reply.texts, reply.token_bytes, strict=True)
        return dict(zip(wanted, pairs, strict=True))

    def _fetch_in_background(self) -> None:
        if self._whole and self._fetching is None:
            # Its own task: a request cancelled meanwhile leaves it running for the others.
            self._fetching = asyncio.ensure_future(self._fetch())

    async def _fetch(self) -> None:
        try:
            reply = await self._stub.TokenTexts(tokenizer_pb2.TokenTextsRequest(whole_vocabulary=True))
        except Exception as exc:  # the tokenizer is down or restarting: a later lookup tries again
            log.warning("fetching the token table failed; trying again later", extra={"error": str(exc)})
            self._fetching = None
            return
        if reply.texts:
            self._table = (list(reply.texts), list(reply.token_bytes))
        else:  # a tokenizer that predates whole_vocabulary
            self._whole = False


def _tokens(positions: Iterable[common_pb2.PositionLogprobs]) -> Iterator[common_pb2.TokenLogprob]:
    for position in positions:
        yield position.token
        yield from position.top
        yield from position.requested


async def fill_texts(texts: TokenTexts, *groups: Iterable[common_pb2.PositionLogprobs]) -> None:
    """Set `text` and `token_bytes` on every TokenLogprob of the groups, in place."""
    tokens = [t for group in groups for t in _tokens(group)]
    if not tokens:
        return
    found = await texts.of(t.token_id for t in tokens)
    for token in tokens:
        token.text, token.token_bytes = found[token.token_id]
