"""bench_detokenize: both detokenizer paths give the same text (the benchmark refuses to report otherwise), and
every section reports a number per path."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.bench_detokenize import PROMPT_TOKENS, main, push_us_per_token, sample_ids
from services.tokenizer.text_tokenizer import TextTokenizer


def test_both_paths_of_a_push_give_the_tokenizers_decode(default_model_dir: Path) -> None:
    tokenizer = TextTokenizer(default_model_dir)
    ids = sample_ids(tokenizer, 400)
    whole = tokenizer.backend.decode(ids[PROMPT_TOKENS:])
    for decode_stream in (True, False):
        spent, text = push_us_per_token(tokenizer, ids, decode_stream=decode_stream)
        assert text == whole
        assert spent > 0


def test_every_section_reports(default_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["--model", str(default_model_dir), "--tokens", "64", "--rounds", "1", "--sequences", "4", "--steps", "8"])
    out = capsys.readouterr().out
    for row in ("Python windows", "DecodeStream", "handler"):
        assert any(line.strip().startswith(row) and "median" in line for line in out.splitlines()), out
