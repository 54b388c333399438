"""`make kernel-report`: registers, spills, shared memory and occupancy of every Triton kernel the
engine launches, per specialisation and NVIDIA architecture, compiled ahead of time without a GPU
(benchmarks/kernel_aot.py), as the Markdown table docs/benchmarks.md holds; and the checks the
ahead-of-time tests (tests/engine/kernels/test_aot_compile.py) hold every specialisation to:

- it compiles;
- no register spills inside a loop, and at most SPILL_BYTES_OUTSIDE_LOOPS stored outside every
  loop: those run once per program (ptxas parks a long-lived value around an out-of-line slow path
  or an epilogue), next to the kilobytes each program streams from global memory, while a spill in
  the K/V loop runs every iteration;
- shared memory within the architecture's per-block limit (beyond it the launch fails);
- at least OCCUPANCY_FLOOR_WARPS warps resident per SM (gpu_occupancy.occupancy): two per warp
  scheduler, the fewest that let one warp's memory latency hide behind another's work.

    python -m benchmarks.kernel_report [--arch 80 90 100] [--launcher rms_norm ...] [--jobs N] [--json PATH]

Exits with status 1 when a specialisation fails a check.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

from benchmarks.gpu_occupancy import ARCHS, occupancy
from benchmarks.kernel_aot import AotRun, Unit, run

SPILL_BYTES_OUTSIDE_LOOPS = 64
OCCUPANCY_FLOOR_WARPS = 8


def problems(unit: Unit) -> dict[str, str]:
    """The checks `unit` fails ("compiles", "spills", "shared memory", "occupancy") -> why."""
    spec, res = unit.spec, unit.resources
    if res.error is not None:
        return {"compiles": res.error}
    found = {}
    limits = ARCHS[spec.arch]
    if res.spills_in_loops or res.spill_stores > SPILL_BYTES_OUTSIDE_LOOPS:
        found["spills"] = (
            f"{res.spill_stores} B spilled ({res.spill_loads} B reloaded), {res.spills_in_loops} spill "
            f"instructions inside loops; allowed: none inside loops, {SPILL_BYTES_OUTSIDE_LOOPS} B outside"
        )
    if res.shared_bytes > limits.max_shared_per_block:
        allowed = limits.max_shared_per_block
        found["shared memory"] = f"{res.shared_bytes} B of shared memory, {limits.name} allows {allowed} B per block"
    fit = occupancy(limits, res.registers, spec.num_warps, res.shared_bytes)
    if fit.warps_per_sm < OCCUPANCY_FLOOR_WARPS:
        found["occupancy"] = (
            f"{fit.warps_per_sm} warps per SM ({fit.blocks_per_sm} blocks of {spec.num_warps}, limited by "
            f"{fit.limited_by}), below the floor of {OCCUPANCY_FLOOR_WARPS}"
        )
    return found


def describe(unit: Unit) -> str:
    """`unit` in one line, for failure messages."""
    spec = unit.spec
    more = " ..." if len(spec.sources) > 1 else ""
    return f"{spec.kernel} sm_{spec.arch} {spec.dtype} {spec.label} [{spec.sources[0]}{more}]"


def cell(unit: Unit) -> str:
    """registers / spilled bytes / shared KiB / occupancy, for one architecture's column."""
    res = unit.resources
    if res.error is not None:
        return "does not compile"
    fit = occupancy(ARCHS[unit.spec.arch], res.registers, unit.spec.num_warps, res.shared_bytes)
    spilled = f"{res.spill_stores} B {'in loop' if res.spills_in_loops else 'once'}" if res.spill_stores else "0"
    text = f"{res.registers} / {spilled} / {res.shared_bytes / 1024:.1f} / {fit.fraction:.0%}"
    return text + (" **(" + ", ".join(problems(unit)) + ")**" if problems(unit) else "")


def launched_for(unit: Unit) -> str:
    """The models, dtypes and engine steps a specialisation serves, condensed."""
    models, dtypes, steps = set(), set(), []
    for source in unit.spec.sources:  # "llama-3.1-8b bf16: paged_decode (decode, eager, 25 blocks)"
        who, what = source.split(": ", 1)
        model, dtype = who.split(" ")
        models.add(model.rsplit("-", 1)[-1])
        dtypes.add(dtype)
        step = what.split(" (", 1)[1].rstrip(")")
        if step not in steps:
            steps.append(step)
    return f"{' '.join(sorted(models))} {'/'.join(sorted(dtypes))}: {'; '.join(steps)}"


def markdown(result: AotRun) -> str:
    """One row per specialisation (its constexprs, warps and int specialisations), one column per architecture."""
    rows: dict[tuple[str, ...], dict[int, Unit]] = defaultdict(dict)
    for unit in result.units:
        spec = unit.spec
        variant = json.dumps([spec.kernel, spec.signature, spec.constants, spec.attrs, spec.num_warps], sort_keys=True)
        rows[(spec.kernel, spec.dtype, spec.label, variant)][spec.arch] = unit
    archs = sorted(result.archs)
    header = ["kernel", "dtype", "specialisation", "launched for", *(ARCHS[a].name for a in archs)]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for key in sorted(rows, key=lambda k: (k[0], k[1], k[2])):
        by_arch = rows[key]
        first = next(iter(by_arch.values()))
        cells = [cell(by_arch[a]) if a in by_arch else "-" for a in archs]
        lines.append("| " + " | ".join([key[0], key[1], key[2], launched_for(first), *cells]) + " |")
    return "\n".join(lines)


def summary(result: AotRun) -> str:
    """Per architecture: specialisations, kernels, failures, allowed spills, the lowest occupancy."""
    lines = []
    for arch in sorted(result.archs):
        units = [u for u in result.units if u.spec.arch == arch]
        failing = sum(bool(problems(u)) for u in units)
        spilling = sum(u.resources.spill_stores > 0 and not problems(u) for u in units)
        lowest = min(
            occupancy(ARCHS[arch], u.resources.registers, u.spec.num_warps, u.resources.shared_bytes).fraction
            for u in units
            if u.resources.error is None
        )
        lines.append(
            f"- {ARCHS[arch].name} ({ARCHS[arch].gpus}): {len(units)} specialisations of "
            f"{len({u.spec.kernel for u in units})} kernels, {failing} failing a check; {spilling} spill a few "
            f"bytes outside every loop (allowed); lowest occupancy {lowest:.1%}"
        )
    if result.uncovered:
        lines.append(f"- JIT functions no launch compiles: {', '.join(result.uncovered)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, nargs="+", choices=sorted(ARCHS), default=sorted(ARCHS))
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="compiles at once")
    parser.add_argument("--launcher", nargs="+", default=None, help="only these launchers' calls, e.g. rms_norm")
    parser.add_argument("--json", type=Path, default=None, help="also write every specialisation and result here")
    args = parser.parse_args(argv)
    result = run(args.arch, args.jobs, set(args.launcher) if args.launcher else None)
    if args.json is not None:
        args.json.write_text(json.dumps(result.to_json(), indent=1))
    print(f"Triton {result.triton}; cells: registers / spilled bytes / shared KiB / occupancy\n")
    print(markdown(result))
    print()
    print(summary(result))
    failing = [u for u in result.units if problems(u)]
    for unit in failing:
        print(f"FAIL {describe(unit)}: {problems(unit)}", file=sys.stderr)
    sys.exit(1 if failing or result.uncovered else 0)


if __name__ == "__main__":
    main()
