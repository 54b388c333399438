"""`bench_peers`: the smoke run serves and measures Turnout end to end, and the table and the
llama-server token count come out right. The peers themselves are never installed here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import peer_installs
from benchmarks.bench_peers import SMOKE, Row, main, table
from benchmarks.peer_client import Result, _llama_log_tokens


def test_smoke_run_serves_turnout_and_counts_every_token(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    rows = main(["--smoke", "--client", "builtin", "--model", str(tiny_model_dir), "--json", str(out)])
    assert [(r.server, r.precision) for r in rows] == [("turnout", "float32")]
    result = rows[0].result
    assert result.completed == SMOKE.num_prompts
    # ignore_eos: the usage chunks add up to exactly the requested tokens.
    assert result.output_tokens == result.expected_tokens == SMOKE.num_prompts * SMOKE.output_len
    assert result.output_throughput > 0 and result.median_ttft_ms > 0 and result.median_tpot_ms > 0
    assert json.loads(out.read_text())[0]["result"]["output_tokens"] == result.output_tokens


@pytest.mark.skipif(not peer_installs.vllm_installed(), reason="peers' venv not installed (make bench-peers)")
def test_smoke_run_through_vllm_bench_serve(tiny_model_dir: Path) -> None:
    rows = main(["--smoke", "--client", "vllm", "--model", str(tiny_model_dir)])
    assert rows[0].result.output_tokens == rows[0].result.expected_tokens


def _row(server: str, tok_s: float, tokens: int = 128) -> Row:
    return Row(server, "float32", "w", Result(tokens, 128, tokens / tok_s, 10.0, 5.0, 1))


def test_table_gives_turnout_over_each_peer_and_flags_wrong_token_counts() -> None:
    text = table([_row("turnout", 100.0), _row("vllm", 50.0), _row("llama.cpp", 200.0, tokens=120)])
    turnout, vllm, llama = text.splitlines()[2:]
    assert turnout.endswith("|  |") and vllm.endswith("| 2.00x |") and llama.endswith("| 0.50x |")
    assert "**120 of 128 tokens**" in llama and "tokens**" not in vllm


def test_llama_tokens_are_summed_from_its_log_after_the_offset(tmp_path: Path) -> None:
    log = tmp_path / "llama.log"
    timing = "slot print_timing: id  0 | task 1 | \n"
    old = timing + "       eval time =     100.00 ms /   999 tokens (    1.00 ms per token,  1.00 tokens per second)\n"
    log.write_text(old)
    offset = log.stat().st_size
    with log.open("a") as f:
        for n in (128, 127):
            f.write(timing)
            f.write(
                "prompt eval time =      10.00 ms /   128 tokens (    0.08 ms per token, 12800.00 tokens per second)\n"
            )
            f.write(
                f"       eval time =     500.00 ms /   {n} tokens (    3.90 ms per token,   256.00 tokens per second)\n"
            )
    assert _llama_log_tokens(log, offset) == 255
