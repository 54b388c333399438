"""Kernel launchers allocate their outputs; inside `poisoned_outputs()` every tensor they allocate
with torch.empty / torch.empty_like starts as NaN (floats) or -7 (integers), so an element a
kernel fails to write shows up in the result instead of passing as whatever the memory held."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import torch

POISON_INT = -7


def _poison(t: torch.Tensor) -> torch.Tensor:
    return t.fill_(float("nan") if t.is_floating_point() else POISON_INT)


@contextmanager
def poisoned_outputs() -> Iterator[None]:
    empty, empty_like = torch.empty, torch.empty_like

    def poisoned_empty(*args: Any, **kwargs: Any) -> torch.Tensor:
        return _poison(empty(*args, **kwargs))

    def poisoned_empty_like(*args: Any, **kwargs: Any) -> torch.Tensor:
        return _poison(empty_like(*args, **kwargs))

    with mock.patch.object(torch, "empty", poisoned_empty), mock.patch.object(torch, "empty_like", poisoned_empty_like):
        yield
