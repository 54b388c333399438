"""The stack the compatibility suite runs against: the default model (real text, as the peers'
tests expect), served the way a vLLM or SGLang user would start it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.e2e.stack import Stack, start_stack

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="session")
def compat_stack(default_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = start_stack(
        default_model_dir,
        tmp_path_factory.mktemp("logs") / "compat-stack.log",
        "--served-model-name",
        MODEL,
        # Exact outputs are compared between streamed and whole replies: float32 on every CPU.
        "--dtype",
        "float32",
        "--tool-call-parser",
        "hermes",
    )
    yield stack
    stack.stop()


@pytest.fixture(scope="session")
def client(compat_stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{compat_stack.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
