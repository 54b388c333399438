"""bench_startup: one start of the tokenizer and the router, each reported with its numbers (the tokenizer
without torch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.bench_startup import main


def test_each_service_started_is_reported(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    services = ["tokenizer", "router"]
    main(["--model", str(tiny_model_dir), "--services", *services, "--repeats", "1", "--log", str(tmp_path / "log")])
    rows = {line.split("|")[1].strip(): line for line in capsys.readouterr().out.splitlines()[2:]}
    assert sorted(rows) == sorted(services), rows
    for row in rows.values():
        wall, cpu, rss, torch_loaded = (cell.strip() for cell in row.split("|")[2:6])
        assert float(wall) > 0 and float(cpu) > 0 and float(rss) > 0, row
        assert torch_loaded == "no", row
