"""`python -m benchmarks.bench_soak --smoke` on the tiny model: the soak script cannot rot."""

from __future__ import annotations

from pathlib import Path

from benchmarks.bench_soak import parse_args, run

SERVICES = {"launcher", "engine", "tokenizer", "router", "gateway"}


def test_smoke_soak_sends_the_whole_mix_and_measures_every_service(tiny_model_dir: Path) -> None:
    report = run(parse_args(["--model", str(tiny_model_dir), "--smoke"]))

    assert report.tally.done == 120 and not report.stopped_early
    assert report.tally.failed == 0, report.markdown()
    outcomes = report.tally.outcomes
    assert outcomes["2xx"] > 0 and outcomes["expected 4xx"] > 0 and outcomes["2xx, hung up"] > 0
    assert outcomes["unexpected 4xx"] == outcomes["unexpected 2xx"] == 0, report.markdown()
    assert len(report.tally.by_kind) >= 10
    for moment in ("start", "middle", "end"):
        assert set(report.rss[moment]) >= SERVICES, report.rss
        assert all(rss > 0 for rss in report.rss[moment].values())
    assert "| engine |" in report.markdown()
