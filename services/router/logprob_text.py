"""Fills in the text and bytes of every token in log-probabilities (the engine knows only ids)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from turnout.v1 import common_pb2, tokenizer_pb2, tokenizer_pb2_grpc


def _tokens(positions: Iterable[common_pb2.PositionLogprobs]) -> Iterator[common_pb2.TokenLogprob]:
    for position in positions:
        yield position.token
        yield from position.top
        yield from position.requested


async def fill_texts(
    tokenizer: tokenizer_pb2_grpc.TokenizerStub, *groups: Iterable[common_pb2.PositionLogprobs]
) -> None:
    """Set `text` and `token_bytes` on every TokenLogprob of the groups, in place, with one RPC."""
    tokens = [t for group in groups for t in _tokens(group)]
    if not tokens:
        return
    unique = list(dict.fromkeys(t.token_id for t in tokens))
    reply = await tokenizer.TokenTexts(tokenizer_pb2.TokenTextsRequest(token_ids=unique))
    texts = dict(zip(unique, zip(reply.texts, reply.token_bytes, strict=True), strict=True))
    for token in tokens:
        token.text, token.token_bytes = texts[token.token_id]
