from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.stack import Stack, start_stack


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
    )
    yield stack
    stack.stop()
