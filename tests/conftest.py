"""Fixtures shared by the whole suite: the models the tests run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# Without a GPU, Triton kernels are tested in Triton's interpreter on CPU tensors. Triton reads
# this when a kernel is defined, so it is set before any test module imports one.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from services.engine.config import KV_CACHE_SPACE_ENV
from tests.credentials import TEST_ADMIN_KEY, TEST_INTERNAL_TOKEN
from tests.models import build_tiny_llama, build_tiny_thinking_llama
from turnout.default_model import prepare_default_model
from turnout.security import ADMIN_KEY_ENV, INTERNAL_TOKEN_ENV

# Services the tests start inherit these (tests/credentials.py): the suite runs the secure path.
os.environ[INTERNAL_TOKEN_ENV] = TEST_INTERNAL_TOKEN
os.environ[ADMIN_KEY_ENV] = TEST_ADMIN_KEY
# The engines the tests start get a 0.5 GiB KV pool unless a test asks for another (11,648 tokens of the
# default model in float32, ~1M of the tiny one): the CPU default (4 GiB, at most a tenth of RAM) is allocated and
# its pages faulted in at every engine start, 1.7 s and 1.9 GiB more per engine on a 24 GiB machine.
os.environ.setdefault(KV_CACHE_SPACE_ENV, "0.5")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `cuda` are skipped where there is no CUDA device."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder (converted once per machine, cached on disk)."""
    return prepare_default_model()


@pytest.fixture(scope="session")
def tiny_model_dir(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer random Llama with the default model's tokenizer and chat template."""
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), default_model_dir)


@pytest.fixture(scope="session")
def tiny_thinking_model_dir(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Llama with <think> / </think> special tokens and a template that pre-fills <think>."""
    return build_tiny_thinking_llama(tmp_path_factory.mktemp("tiny-thinking-llama"), default_model_dir)
