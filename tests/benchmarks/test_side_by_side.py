"""bench_router --against: the other checkout exported once, and what each stack's gateway path adds."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path
from typing import Any

import pytest

from benchmarks import side_by_side
from benchmarks.bench_router import Arrivals

REPO = Path(__file__).resolve().parents[2]


def test_a_revision_is_exported_once_with_its_protos_and_labelled_by_its_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(side_by_side.tempfile, "gettempdir", lambda: str(tmp_path))
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    root, label = side_by_side.checkout("HEAD")
    assert root == tmp_path / "turnout-against" / commit and label == commit[:7]
    assert (root / "turnout" / "cli.py").read_bytes() == subprocess.run(
        ["git", "show", "HEAD:turnout/cli.py"], capture_output=True, check=True
    ).stdout
    assert (root / "turnout" / "v1" / "engine_pb2.py").is_file()  # generated, not in git
    marker = root / "kept-from-the-first-export"
    marker.touch()
    assert side_by_side.checkout(commit[:10]) == (root, label)
    assert marker.exists()  # the second run found the export (and the kernels built in it) and kept it


def test_neither_a_folder_nor_a_commit_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit, match="--against no-such-rev: neither a folder nor a commit"):
        side_by_side.checkout("no-such-rev")


def test_a_folder_is_taken_as_it_is() -> None:
    root, label = side_by_side.checkout(str(REPO))
    assert root == REPO and label.split()[0] == side_by_side.label_of(REPO).split()[0]


def _arrivals(ttft_ms: float, gap_ms: float, tokens: int = 3) -> Arrivals:
    start = 100.0
    first = start + ttft_ms / 1e3
    return Arrivals(start, [first + i * gap_ms / 1e3 for i in range(tokens)])


def test_each_stacks_gateway_path_is_measured_against_its_own_engine() -> None:
    args = argparse.Namespace(against_blocks=2, against_block_requests=1)
    sides = []
    for label, engine_ms, gateway_ms, itl in (("head", 4.0, 9.0, 1.5), ("base", 6.0, 13.0, 1.8)):
        side: Any = side_by_side.Side(label, stack=None)  # type: ignore[arg-type]
        side.arrivals = {
            "engine": [_arrivals(engine_ms, 1.0), _arrivals(engine_ms, 1.0)],
            "router": [_arrivals(engine_ms + 1, 1.2), _arrivals(engine_ms + 1, 1.2)],
            "gateway": [_arrivals(gateway_ms, itl), _arrivals(gateway_ms, itl)],
        }
        side.cpu_s = {"gateway": 0.006, "router": 0.004, "tokenizer": 0.002, "engine": 0.001}
        sides.append(side)
    lines = side_by_side.table(sides, args)
    assert "| head | gateway HTTP SSE + router | 9.00 ms (+5.00) | 1.50 ms (+0.50) | 3.00, 2.00, 1.00, 0.50 |" in lines
    assert "| base | router gRPC | 7.00 ms (+1.00) | 1.20 ms (+0.20) |  |" in lines
    summary = "The gateway path adds, head against base: TTFT **+5.00** vs +7.00 ms, ITL **+0.50** vs +0.80 ms."
    assert lines[-1] == summary


def test_one_token_outputs_have_no_gaps_and_say_so() -> None:
    args = argparse.Namespace(against_blocks=1, against_block_requests=1)
    sides = []
    for label in ("head", "base"):
        side: Any = side_by_side.Side(label, stack=None)  # type: ignore[arg-type]
        side.arrivals = {p: [_arrivals(5.0 if p == "gateway" else 2.0, 0.0, tokens=1)] for p in side_by_side.PATH_NAMES}
        sides.append(side)
    lines = side_by_side.table(sides, args)
    assert "| head | gateway HTTP SSE + router | 5.00 ms (+3.00) | - | 0.00, 0.00, 0.00, 0.00 |" in lines
    assert lines[-1] == "The gateway path adds, head against base: TTFT **+3.00** vs +3.00 ms."
