"""Triton kernels of the CUDA path, each with a torch reference in the same module.

On a GPU they are the fast path. On a CPU they run only under Triton's interpreter
(`TRITON_INTERPRET=1`, read by Triton when a kernel is defined, so it must be set before these
modules are imported): that is how the test suite checks them against their references on
machines without a GPU.
"""

from __future__ import annotations

import importlib.util
import os

import torch


def interpreting() -> bool:
    """Whether Triton kernels run in its interpreter (on CPU tensors) instead of compiled for a GPU."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def triton_runs_on(device: torch.device) -> bool:
    """Whether Triton kernels can run on tensors of `device`: compiled on CUDA, interpreted on CPU."""
    if importlib.util.find_spec("triton") is None:
        return False
    if device.type == "cuda":
        return True
    return device.type == "cpu" and interpreting()
