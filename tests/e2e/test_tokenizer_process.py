"""The `turnout tokenizer` process runs without torch (services/tokenizer/without_torch.py) and
answers as the same tokenizer loaded with torch does."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.tokenizer.text_tokenizer import TextTokenizer
from tests.credentials import INTERNAL
from tests.e2e.services import Service
from turnout.grpc_server import client_channel
from turnout.v1 import common_pb2, tokenizer_pb2, tokenizer_pb2_grpc


@pytest.fixture(scope="module")
def tokenizer(tiny_thinking_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    log = tmp_path_factory.mktemp("tokenizer-process") / "tokenizer.log"
    service = Service("tokenizer", ["tokenizer", "--model", str(tiny_thinking_model_dir)], log).start()
    try:
        yield service.wait_healthy()
    finally:
        service.stop()


def _mapped_files(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_the_tokenizer_process_never_loads_torch(tokenizer: Service) -> None:
    assert tokenizer.process is not None
    assert "libtorch" not in _mapped_files(tokenizer.process.pid)
    import torch  # this process has it: the check above would see it

    assert "libtorch" in _mapped_files(os.getpid()), torch.__file__
    assert "PyTorch was not found" not in tokenizer.log()


def test_it_encodes_and_renders_chats_as_the_tokenizer_with_torch(
    tokenizer: Service, tiny_thinking_model_dir: Path
) -> None:
    local = TextTokenizer(tiny_thinking_model_dir)
    text = "Hello, world! émoji 🦙 <think>x</think>"
    chat = common_pb2.ChatInput(messages=[common_pb2.ChatMessage(role="user", content=text)])

    async def ask() -> tuple[list[int], str, str]:
        async with client_channel(tokenizer.address, INTERNAL) as channel:
            stub = tokenizer_pb2_grpc.TokenizerStub(channel)
            encoded = await stub.Encode(tokenizer_pb2.EncodeRequest(text=text), timeout=60)
            rendered = await stub.Encode(tokenizer_pb2.EncodeRequest(chat=chat), timeout=60)
            info = await stub.GetInfo(tokenizer_pb2.GetTokenizerInfoRequest(), timeout=60)
        return list(encoded.input_ids), rendered.prompt_text, info.tokenizer_class

    ids, rendered, tokenizer_class = asyncio.run(ask())
    assert ids == local.encode(text)
    assert rendered == local._hf.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    assert tokenizer_class == type(local._hf).__name__
