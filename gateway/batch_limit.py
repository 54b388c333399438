"""The limit on prompts per request (`--max-client-batch-size`), and how a batch fans out.

A batch fans out into one router call per prompt, so an unbounded batch is
unbounded work and memory from one request. Generation calls of a batch run all
at once (the engine batches them); the tokenizer calls of a batch (/tokenize,
/detokenize, echo and logprob look-ups) go through `gather_bounded`, a few at a
time, so that one 1,024-prompt /tokenize does not put 1,024 calls ahead of every
other client's request in each service's queue.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import TypeVar

from starlette.requests import Request

from gateway.config import GatewayConfig
from gateway.errors import invalid_request

T = TypeVar("T")

# Tokenizer calls of one batch in flight at once: enough to keep the tokenizer's lanes busy,
# few enough that another client's request waits behind at most this many of them per service.
BATCH_FANOUT = 8


def check_batch_size(request: Request, count: int, param: str) -> None:
    """400 naming `param`, the limit and its flag when a batch has more than the limit's entries."""
    config: GatewayConfig = request.app.state.config
    limit = config.max_client_batch_size
    if count > limit:
        raise invalid_request(
            f"'{param}' has {count} entries, more than the limit of {limit} per request (--max-client-batch-size)",
            param,
        )


async def gather_bounded(calls: Iterable[Awaitable[T]], limit: int = BATCH_FANOUT) -> list[T]:
    """The results of `calls` in their order, at most `limit` of them awaited at once. The first
    failure cancels the rest and is raised, as asyncio.gather's would be."""
    pending = list(calls)
    if len(pending) == 1:
        # One prompt, the usual request: awaited in the caller's task, without worker tasks.
        return [await pending[0]]
    numbered = enumerate(pending)  # shared by the workers: each call is taken by exactly one
    results: dict[int, T] = {}

    async def worker() -> None:
        for index, call in numbered:
            results[index] = await call

    workers = [asyncio.ensure_future(worker()) for _ in range(min(limit, len(pending)))]
    try:
        await asyncio.gather(*workers)
    except BaseException:
        for task in workers:
            task.cancel()
        for _, call in numbered:  # never started: close them, or each warns "never awaited"
            close = getattr(call, "close", None)
            if close is not None:
                close()
        raise
    return [results[i] for i in range(len(results))]
