"""Fills in the text and bytes of every token in log-probabilities (the engine knows only ids).

A token's text and bytes are a function of its id and the tokenizer alone, so the router keeps each
tokenizer replica's whole table (`TokenTexts`), fetched in one `TokenTexts` call the first time a request
asks for logprobs as text: before, every engine message of such a request cost a `TokenTexts` call, a
round trip to the tokenizer for every token it streamed. The table holds the vocabulary's texts and bytes
(a few MB for a 50k vocabulary, ~25 MB for 256k). A replica keeps its vocabulary while the router runs, as
an engine keeps its model: ids would mean other tokens to the engines otherwise.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator, Sequence

from turnout.v1 import common_pb2, tokenizer_pb2, tokenizer_pb2_grpc

_Table = tuple[Sequence[str], Sequence[bytes]]


class TokenTexts:
    """One tokenizer replica's token table: every id's text and bytes, fetched whole on first use. A
    tokenizer that cannot send it whole (one that predates `whole_vocabulary`) is asked for the ids of each
    lookup instead, as before."""

    def __init__(self, stub: tokenizer_pb2_grpc.TokenizerStub) -> None:
        self._stub = stub
        self._table: _Table | None = None
        self._whole = True  # whether the tokenizer sends the whole table
        self._loading: asyncio.Future[_Table] | None = None

    async def of(self, ids: Iterable[int]) -> dict[int, tuple[str, bytes]]:
        """Each of `ids`' text and bytes. An id outside the vocabulary is the tokenizer's to refuse."""
        wanted = list(dict.fromkeys(ids))
        table = self._table if self._table is not None else await self._load()
        texts, raw = table
        if any(token_id >= len(texts) for token_id in wanted):
            texts, raw = await self._ask(wanted)  # the tokenizer names the id it refuses
            return {token_id: (texts[i], raw[i]) for i, token_id in enumerate(wanted)}
        return {token_id: (texts[token_id], raw[token_id]) for token_id in wanted}

    async def _load(self) -> _Table:
        if not self._whole:
            return (), ()
        if self._loading is None:
            self._loading = asyncio.ensure_future(self._fetch())
        loading = self._loading
        try:
            # Shielded: a request cancelled while it waits leaves the fetch to the others.
            return await asyncio.shield(loading)
        except Exception:
            if self._loading is loading:
                self._loading = None  # the next request tries again
            raise

    async def _fetch(self) -> _Table:
        reply = await self._stub.TokenTexts(tokenizer_pb2.TokenTextsRequest(whole_vocabulary=True))
        if not reply.texts:  # a tokenizer that predates whole_vocabulary
            self._whole = False
            return (), ()
        self._table = table = (list(reply.texts), list(reply.token_bytes))
        return table

    async def _ask(self, ids: list[int]) -> _Table:
        reply = await self._stub.TokenTexts(tokenizer_pb2.TokenTextsRequest(token_ids=ids))
        return reply.texts, reply.token_bytes


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
