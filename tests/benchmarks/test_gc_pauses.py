"""The ceiling's collector columns: each service's seconds in its collector over its CPU seconds, and the bound of
its longest pause, from two readings of the stack's page."""

from __future__ import annotations

from benchmarks.service_ceiling import GcPauses

BUCKETS = (0.001, 0.01, 0.1)


def _page(pauses: dict[tuple[str, str], list[float]]) -> str:
    """turnout_gc_pause_seconds for these pauses of each (service, generation)."""
    lines = ["# HELP turnout_gc_pause_seconds pauses", "# TYPE turnout_gc_pause_seconds histogram"]
    for (service, generation), seconds in pauses.items():
        labels = f'generation="{generation}",service="{service}"'
        for bound in (*BUCKETS, float("inf")):
            under = sum(1 for s in seconds if s <= bound)
            le = "+Inf" if bound == float("inf") else str(bound)
            lines.append(f'turnout_gc_pause_seconds_bucket{{{labels},le="{le}"}} {under}')
        lines.append(f"turnout_gc_pause_seconds_count{{{labels}}} {len(seconds)}")
        lines.append(f"turnout_gc_pause_seconds_sum{{{labels}}} {sum(seconds)}")
    return "\n".join(lines) + "\n"


def test_the_share_and_the_longest_pause_count_only_what_came_between_the_readings() -> None:
    before = GcPauses.read(_page({("router", "0"): [0.05], ("router", "2"): [], ("engine", "0"): [0.0005]}))
    after = GcPauses.read(
        _page(
            {
                ("router", "0"): [0.05, 0.002, 0.003],  # the 50 ms pause came before: not this run's longest
                ("router", "2"): [0.02],
                ("engine", "0"): [0.0005],  # nothing new
            }
        )
    )
    shares = after.since(before, {"router": 2.5, "engine": 1.0})
    assert abs(shares["router"].of_cpu - 0.025 / 2.5) < 1e-9
    assert shares["router"].longest_s == 0.1  # the 20 ms full collection, in the (10 ms, 100 ms] bucket
    assert shares["engine"].of_cpu == 0.0 and shares["engine"].longest_s == 0.0
