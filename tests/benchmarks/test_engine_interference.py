"""engine_interference: both rows of every turn report, and the spinner stops."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.engine_interference import main


def test_every_turn_reports_alone_and_with_the_spinner(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    main(["--model", str(tiny_model_dir), "--tokens", "4", "--rounds", "1", "--turns", "1", "--burn-us", "100"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| a")]
    assert [row.split("|")[1].strip().split()[0] for row in rows] == ["alone", "another"]
    assert all(float(row.split("|")[2]) > 0 for row in rows)
