"""--reasoning-parser / --tool-call-parser: from `turnout serve` to the tokenizer's config."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.tokenizer import main as tokenizer_main
from services.tokenizer.config import TokenizerConfig
from services.tokenizer.reasoning import reasoning_parser_class
from services.tokenizer.tool_parsers import tool_parser_class
from turnout import launcher


def tokenizer_argv(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> list[str]:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    args = launcher.build_parser().parse_args(["--model", "/m", *argv])
    stack = launcher.build_stack(args, Path("/m"))
    return next(c.argv for c in stack.children if c.name == "tokenizer")


def test_serve_passes_the_parsers_to_the_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = tokenizer_argv(monkeypatch, ["--reasoning-parser", "qwen3", "--tool-call-parser", "hermes"])
    tail = argv[argv.index("tokenizer") + 1 :]
    args = tokenizer_main.build_parser().parse_args(tail)
    assert (args.reasoning_parser, args.tool_call_parser) == ("qwen3", "hermes")
    plain = tokenizer_argv(monkeypatch, [])
    assert "--reasoning-parser" not in plain and "--tool-call-parser" not in plain


def test_unknown_parser_names_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        launcher.build_parser().parse_args(["--tool-call-parser", "nope"])
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_config_checks_the_names(default_model_dir: Path) -> None:
    config = TokenizerConfig(model=default_model_dir, reasoning_parser="deepseek-r1", tool_call_parser="llama3_json")
    assert config.reasoning_parser == "deepseek-r1"
    with pytest.raises(ValueError, match="unknown reasoning parser 'r2'"):
        TokenizerConfig(model=default_model_dir, reasoning_parser="r2")
    with pytest.raises(ValueError, match="unknown tool-call parser 'x'"):
        TokenizerConfig(model=default_model_dir, tool_call_parser="x")


@pytest.mark.parametrize(
    ("reasoning", "tool"),
    [("deepseek_r1", "deepseekv3"), ("deepseek-v3", "qwen3_xml"), ("qwen3-thinking", "llama4_pythonic")],
)
def test_the_peers_spellings_are_accepted_from_serve_to_the_config(
    monkeypatch: pytest.MonkeyPatch, default_model_dir: Path, reasoning: str, tool: str
) -> None:
    argv = tokenizer_argv(monkeypatch, ["--reasoning-parser", reasoning, "--tool-call-parser", tool])
    args = tokenizer_main.build_parser().parse_args(argv[argv.index("tokenizer") + 1 :])
    # The flags may pass the name on as given or in its canonical spelling: either names the same parser.
    assert reasoning_parser_class(args.reasoning_parser) is reasoning_parser_class(reasoning)
    assert tool_parser_class(args.tool_call_parser) is tool_parser_class(tool)
    config = TokenizerConfig(model=default_model_dir, reasoning_parser=reasoning, tool_call_parser=tool)
    assert (config.reasoning_parser, config.tool_call_parser) == (reasoning, tool)
