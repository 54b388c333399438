"""The router keeps each tokenizer's token table (services/router/logprob_text.py): once it is here, a
request that asks for logprobs as text costs no TokenTexts call; until then, each lookup asks for its ids
and no request waits for the table."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from services.router.logprob_text import TokenTexts, fill_texts
from tests.router.conftest import eventually
from turnout.errors import InvalidArgument, Unavailable
from turnout.v1 import common_pb2, tokenizer_pb2

VOCAB = 100


class _Stub:
    """TokenTexts of a toy vocabulary of VOCAB ids, id t being the text "<t>"; each call's ids are kept
    ("whole" for the whole table). The whole table is answered once `table_ready` is set. `whole=False`: a
    tokenizer that predates whole_vocabulary (answers it with nothing). `down`: that many whole-table
    calls fail UNAVAILABLE first."""

    def __init__(self, whole: bool = True, down: int = 0) -> None:
        self.whole = whole
        self.down = down
        self.table_ready = asyncio.Event()
        self.table_ready.set()
        self.calls: list[str | list[int]] = []

    async def TokenTexts(self, request: Any) -> Any:
        self.calls.append("whole" if request.whole_vocabulary else list(request.token_ids))
        if request.whole_vocabulary:
            await self.table_ready.wait()
            if self.down:
                self.down -= 1
                raise Unavailable("the tokenizer is restarting")
            ids = list(range(VOCAB)) if self.whole else []
        else:
            ids = list(request.token_ids)
            if any(t >= VOCAB for t in ids):
                raise InvalidArgument(f"token id {max(ids)} is out of range for a vocabulary of {VOCAB}")
        texts = [f"<{t}>" for t in ids]
        return tokenizer_pb2.TokenTextsResponse(texts=texts, token_bytes=[text.encode() for text in texts])


def _calls_of(calls: list[str | list[int]]) -> list[str]:
    """The calls in a fixed order: a lookup's own call and the fetch it starts run in either order."""
    return sorted(map(str, calls))


def _calls(stub: _Stub) -> list[str]:
    return _calls_of(stub.calls)


def _entry(token_id: int) -> tuple[str, bytes]:
    return f"<{token_id}>", f"<{token_id}>".encode()


async def test_no_lookup_waits_for_the_table_and_once_it_is_here_none_asks() -> None:
    stub = _Stub()
    stub.table_ready.clear()
    texts = TokenTexts(stub)  # type: ignore[arg-type]
    first = await asyncio.gather(texts.of([5, 6, 5]), texts.of([7]))
    assert first == [{5: _entry(5), 6: _entry(6)}, {7: _entry(7)}]
    assert _calls(stub) == _calls_of(["whole", [5, 6], [7]])  # one fetch, under way; each lookup asked for its ids
    stub.table_ready.set()
    await eventually(lambda: texts._table is not None)
    assert await texts.of([42, 5, 99]) == {42: _entry(42), 5: _entry(5), 99: _entry(99)}
    assert _calls(stub) == _calls_of(["whole", [5, 6], [7]])


async def test_an_id_outside_the_vocabulary_is_the_tokenizers_to_refuse() -> None:
    stub = _Stub()
    texts = TokenTexts(stub)  # type: ignore[arg-type]
    await texts.of([1])
    await eventually(lambda: texts._table is not None)
    with pytest.raises(InvalidArgument, match="token id 100 is out of range"):
        await texts.of([1, 100])
    assert _calls(stub) == _calls_of(["whole", [1], [1, 100]])


async def test_a_tokenizer_without_the_whole_table_is_asked_for_each_lookup() -> None:
    stub = _Stub(whole=False)
    texts = TokenTexts(stub)  # type: ignore[arg-type]
    assert await texts.of([1, 2, 1]) == {1: _entry(1), 2: _entry(2)}
    await eventually(lambda: not texts._whole)
    assert await texts.of([3]) == {3: _entry(3)}
    assert _calls(stub) == _calls_of(["whole", [1, 2], [3]])  # asked for the table once


async def test_a_failed_fetch_is_tried_again_by_a_later_lookup() -> None:
    stub = _Stub(down=1)
    texts = TokenTexts(stub)  # type: ignore[arg-type]
    assert await texts.of([1]) == {1: _entry(1)}
    await eventually(lambda: texts._fetching is None)  # failed, logged, forgotten
    assert texts._table is None
    assert await texts.of([2]) == {2: _entry(2)}
    await eventually(lambda: texts._table is not None)
    assert _calls(stub) == _calls_of(["whole", [1], "whole", [2]])


async def test_a_lookup_cancelled_while_the_table_comes_leaves_the_fetch_running() -> None:
    stub = _Stub()
    stub.table_ready.clear()
    texts = TokenTexts(stub)  # type: ignore[arg-type]
    lookup = asyncio.create_task(texts.of([1]))
    await eventually(lambda: "whole" in stub.calls)
    lookup.cancel()
    stub.table_ready.set()
    await eventually(lambda: texts._table is not None)


async def test_fill_texts_sets_every_token_of_every_position() -> None:
    position = common_pb2.PositionLogprobs(
        token=common_pb2.TokenLogprob(token_id=3),
        top=[common_pb2.TokenLogprob(token_id=3), common_pb2.TokenLogprob(token_id=4)],
        requested=[common_pb2.TokenLogprob(token_id=9)],
    )
    await fill_texts(TokenTexts(_Stub()), [position])  # type: ignore[arg-type]
    tokens = (position.token, *position.top, *position.requested)
    assert [(t.text, t.token_bytes) for t in tokens] == [_entry(3), _entry(3), _entry(4), _entry(9)]
