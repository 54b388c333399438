"""Threads that run tokenizer work off the event loop, in two lanes by size.

Encoding and decoding call the Rust side through `*_batch`, which releases the
GIL, so a thread busy with a megabyte prompt does not stall the event loop. Long
inputs get a lane of their own: however many of them arrive, short ones (every
normal prompt, stop strings, a /tokenize of a sentence) never queue behind them.

The lanes are the only parallelism: `tokenizers`' own (a rayon pool shared by every
`*_batch` call) is switched off, or a short encode waits for the rayon thread busy
with a long one (measured with a 1.5 MB prompt running: a short Encode took up to
345 ms with it, 13 ms without).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

# Inputs up to this many bytes (or token ids) take the short lane: well past any chat turn, yet
# encoded in a few milliseconds.
SHORT_INPUT = 64 * 1024


class WorkLanes:
    def __init__(self, *, short_threads: int = 2, long_threads: int = 1) -> None:
        # Read by the Rust side at each batch call; the whole process shares it (it is the tokenizer's).
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        self._short = ThreadPoolExecutor(short_threads, thread_name_prefix="tokenize-short")
        self._long = ThreadPoolExecutor(long_threads, thread_name_prefix="tokenize-long")

    async def run(self, size: int, work: Callable[[], T]) -> T:
        """`work()` in a thread of the lane for an input of `size` bytes (or ids)."""
        lane = self._short if size <= SHORT_INPUT else self._long
        return await asyncio.get_running_loop().run_in_executor(lane, work)

    def close(self) -> None:
        self._short.shutdown(wait=False, cancel_futures=True)
        self._long.shutdown(wait=False, cancel_futures=True)
