"""--chat-template-content-format: how a message's content reaches the chat template."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.tokenizer.config import TokenizerConfig
from services.tokenizer.convert import message_to_dict
from turnout.v1 import common_pb2

PARTS = common_pb2.ChatMessage(
    role="user",
    content_parts=[common_pb2.ContentPart(type="text", text="a"), common_pb2.ContentPart(type="text", text="b")],
)
TEXT = common_pb2.ChatMessage(role="user", content="plain")


@pytest.mark.parametrize("content_format", ["auto", "string"])
def test_string_joins_the_parts(content_format: str) -> None:
    assert message_to_dict(PARTS, content_format)["content"] == "a\nb"
    assert message_to_dict(TEXT, content_format)["content"] == "plain"


def test_openai_passes_a_list_of_parts() -> None:
    assert message_to_dict(PARTS, "openai")["content"] == [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert message_to_dict(TEXT, "openai")["content"] == [{"type": "text", "text": "plain"}]


def test_a_separate_tokenizer_folder_and_auto_tool_choice(default_model_dir: Path, tmp_path: Path) -> None:
    config = TokenizerConfig(model=tmp_path, tokenizer=default_model_dir)  # the model folder has no tokenizer
    assert config.tokenizer_folder == default_model_dir
    with pytest.raises(ValueError, match=r"--model .*no tokenizer\.json"):
        TokenizerConfig(model=tmp_path)
    with pytest.raises(ValueError, match="--enable-auto-tool-choice needs --tool-call-parser"):
        TokenizerConfig(model=default_model_dir, enable_auto_tool_choice=True)
    assert TokenizerConfig(model=default_model_dir, enable_auto_tool_choice=True, tool_call_parser="hermes")
