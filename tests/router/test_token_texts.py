"""The router keeps each tokenizer's token table (services/router/logprob_text.py): a request that asks for
logprobs as text costs no TokenTexts call once the table is here."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from services.router.logprob_text import TokenTexts, fill_texts
from turnout.errors import InvalidArgument, Unavailable
from turnout.v1 import common_pb2, tokenizer_pb2

VOCAB = 100


class _Stub:
    """TokenTexts of a toy vocabulary of VOCAB ids, id t being the text "<t>"; each call's request is kept.
    `whole=False`: a tokenizer that predates whole_vocabulary (answers it with nothing). `down`: that many
    calls fail UNAVAILABLE first."""

    def __init__(self, whole: bool = True, down: int = 0) -> None:
        self.whole = whole
        self.down = down
        self.calls: list[str | list[int]] = []

    async def TokenTexts(self, request: Any) -> Any:
        await asyncio.sleep(0)
        self.calls.append("whole" if request.whole_vocabulary else list(request.token_ids))
        if self.down:
            self.down -= 1
            raise Unavailable("the tokenizer is restarting")
        if request.whole_vocabulary:
            ids = list(range(VOCAB)) if self.whole else []
        else:
            ids = list(request.token_ids)
            if any(t >= VOCAB for t in ids):
                raise InvalidArgument(f"token id {max(ids)} is out of range for a vocabulary of {VOCAB}")
        texts = [f"<{t}>" for t in ids]
        return tokenizer_pb2.TokenTextsResponse(texts=texts, token_bytes=[text.encode() for text in texts])


def _entry(token_id: int) -> tuple[str, bytes]:
    return f"<{token_id}>", f"<{token_id}>".encode()


async def test_the_table_is_fetched_once_whoever_asks_first() -> None:
    stub = _Stub()
    texts = TokenTexts(stub)  # type: ignore[arg-type]
    first = await asyncio.gather(texts.of([5, 6, 5]), texts.of([7]), texts.of([99, 0]))
    assert first == [{5: _entry(5), 6: _entry(6)}, {7: _entry(7)}, {99: _entry(99), 0: _entry(0)}]
    assert await texts.of([42, 5]) == {42: _entry(42), 5: _entry(5)}
    assert stub.calls == ["whole"]


async def test_an_id_outside_the_vocabulary_is_the_tokenizers_to_refuse() -> None:
    stub = _Stub()
    texts = TokenTexts(stub)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="token id 100 is out of range"):
        await texts.of([1, 100])
    assert stub.calls == ["whole", [1, 100]]


async def test_a_tokenizer_without_the_whole_table_is_asked_for_each_lookup() -> None:
    stub = _Stub(whole=False)
    texts = TokenTexts(stub)  # type: ignore[arg-type]
    assert await texts.of([1, 2, 1]) == {1: _entry(1), 2: _entry(2)}
    assert await texts.of([3]) == {3: _entry(3)}
    assert stub.calls == ["whole", [1, 2], [3]]


async def test_a_failed_fetch_fails_its_lookup_and_the_next_one_fetches_again() -> None:
    stub = _Stub(down=1)
    texts = TokenTexts(stub)  # type: ignore[arg-type]
    with pytest.raises(Unavailable):
        await texts.of([1])
    assert await texts.of([1]) == {1: _entry(1)}
    assert stub.calls == ["whole", "whole"]


async def test_a_lookup_cancelled_while_the_table_comes_leaves_the_fetch_to_the_others() -> None:
    stub = _Stub()
    texts = TokenTexts(stub)  # type: ignore[arg-type]
    cancelled = asyncio.create_task(texts.of([1]))
    waiting = asyncio.create_task(texts.of([2]))
    await asyncio.sleep(0)
    cancelled.cancel()
    assert await waiting == {2: _entry(2)}
    assert stub.calls == ["whole"]


async def test_fill_texts_sets_every_token_of_every_position() -> None:
    position = common_pb2.PositionLogprobs(
        token=common_pb2.TokenLogprob(token_id=3),
        top=[common_pb2.TokenLogprob(token_id=3), common_pb2.TokenLogprob(token_id=4)],
        requested=[common_pb2.TokenLogprob(token_id=9)],
    )
    await fill_texts(TokenTexts(_Stub()), [position])  # type: ignore[arg-type]
    tokens = (position.token, *position.top, *position.requested)
    assert [(t.text, t.token_bytes) for t in tokens] == [_entry(3), _entry(3), _entry(4), _entry(9)]
