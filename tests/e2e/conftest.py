from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.stack import Stack, start_stack
from tests.models import build_tiny_thinking_llama


@pytest.fixture(scope="session")
def tiny_stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = start_stack(tiny_model_dir, tmp_path_factory.mktemp("logs") / "tiny-stack.log")
    yield stack
    stack.stop()


@pytest.fixture(scope="session")
def default_stack(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = start_stack(
        default_model_dir,
        tmp_path_factory.mktemp("logs") / "default-stack.log",
        "--served-model-name",
        "SmolLM2-135M-Instruct",
        # float32 on every CPU: tests here hold this model's own outputs (JSON it completes, texts
        # transformers produces), which bfloat16 (`auto` on a CPU with avx512_bf16) changes.
        "--dtype",
        "float32",
        # Tool calls in the Hermes / Qwen2.5 format; processors the tests send as code.
        "--tool-call-parser",
        "hermes",
        "--enable-custom-logit-processor",
    )
    yield stack
    stack.stop()


@pytest.fixture(scope="session")
def thinking_stack(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The tiny random model with <think> tokens (a template that pre-fills <think>), served with the
    qwen3 reasoning parser and the hermes tool-call parser. Its vocabulary is not padded, so every id
    it samples decodes."""
    model = build_tiny_thinking_llama(tmp_path_factory.mktemp("thinking-e2e"), default_model_dir, pad_vocab=False)
    # A short context, as a small deployment would have: a request with no max_tokens (the docs' examples)
    # generates the rest of it, 4,000 random tokens at the model's own length.
    argv = ("--reasoning-parser", "qwen3", "--tool-call-parser", "hermes", "--max-model-len", "512")
    stack = start_stack(model, tmp_path_factory.mktemp("logs") / "thinking-stack.log", *argv)
    yield stack
    stack.stop()
