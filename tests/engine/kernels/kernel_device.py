"""Where the kernel tests run the kernels: compiled, on the GPU where there is one; else in Triton's
interpreter on CPU tensors (tests/conftest.py sets TRITON_INTERPRET when there is no CUDA device,
and the compiled kernels cannot read CPU tensors)."""

from __future__ import annotations

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
