"""Each tokenizer limit is declared once (TokenizerLimits) and becomes a flag of `turnout tokenizer`,
a flag `turnout serve` passes on when given, and a row of docs/api.md."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from services.tokenizer.config import TokenizerLimits
from services.tokenizer.main import build_parser
from turnout import launcher
from turnout.flags import config_kwargs, declared
from turnout.serve_flags import TOKENIZER, child_flags

ROOT = Path(__file__).resolve().parents[2]


def limits_from_args(args: argparse.Namespace) -> TokenizerLimits:
    return TokenizerLimits(**config_kwargs(TokenizerLimits, args))


def limit_args(args: argparse.Namespace) -> list[str]:
    return child_flags(args, TOKENIZER)


def test_the_tokenizer_flags_default_to_the_declared_limits() -> None:
    args = build_parser().parse_args(["--model", "m"])
    assert limits_from_args(args) == TokenizerLimits()
    args = build_parser().parse_args(["--model", "m", "--max-prompt-bytes", "100", "--chat-template-timeout", "0.5"])
    assert limits_from_args(args) == TokenizerLimits(max_prompt_bytes=100, chat_template_timeout=0.5)


def test_serve_passes_on_only_the_limits_given() -> None:
    assert limit_args(launcher.build_parser().parse_args([])) == []
    args = launcher.build_parser().parse_args(["--max-prompt-bytes", "100", "--chat-template-workers", "3"])
    assert limit_args(args) == ["--max-prompt-bytes", "100", "--chat-template-workers", "3"]
    forwarded = build_parser().parse_args(["--model", "m", *limit_args(args)])
    assert limits_from_args(forwarded) == TokenizerLimits(max_prompt_bytes=100, chat_template_workers=3)


@pytest.mark.parametrize("name", ["max_prompt_bytes", "max_token_ids", "max_encode_texts", "chat_template_workers"])
def test_a_limit_below_one_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match=f"--{name.replace('_', '-')} must be at least 1"):
        TokenizerLimits(**{name: 0})


def test_every_limit_has_a_row_in_the_api_docs() -> None:
    docs = (ROOT / "docs" / "api.md").read_text()
    for d in declared(TokenizerLimits):
        assert f"| `{d.flag} {d.spec.metavar}` | {d.default}" in docs
