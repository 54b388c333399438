"""Turnout against the servers a CPU user would pick instead (issue 19): vLLM's CPU build and
llama.cpp's `llama-server`, same model, same client (`vllm bench serve`), one server at a time.

Installs the peers on first use into <turnout cache>/peers (see `peer_installs`), then for each
server and precision: start it alone on loopback, run every workload, stop it. Prints one
Markdown table: output tok/s, median TTFT and TPOT, and Turnout's throughput over each row's.

    python -m benchmarks.bench_peers [--servers turnout,vllm,llama.cpp] [--precisions float32,bfloat16]
        [--workloads c1,c16,c64,prefix] [--num-prompts N] [--model PATH]
    python -m benchmarks.bench_peers --smoke --model TINY   # Turnout only, a handful of short requests

Numbers mean something only on an otherwise idle machine (llama-server's threads spin on each
other under contention); run it with nothing else on the cores.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from benchmarks import peer_installs
from benchmarks.peer_client import Result, Workload, builtin_client, vllm_bench
from benchmarks.peer_servers import PRECISIONS, SERVERS, Server, prepare

# The workloads: 128 prompt / 128 output tokens at 1, 16 and 64 concurrent requests, and
# 4 prompt prefixes of 512 tokens shared by 16 concurrent requests (where a prefix cache pays).
WORKLOADS = {
    "c1": Workload("random 128/128, concurrency 1", 1, 8),
    "c16": Workload("random 128/128, concurrency 16", 16, 64),
    "c64": Workload("random 128/128, concurrency 64", 64, 128),
    "prefix": Workload("4 shared 512-token prefixes + 128/128, concurrency 16", 16, 64, prefix_len=512, num_prefixes=4),
}
SMOKE = Workload("smoke: random 16/8, concurrency 2", 2, 4, input_len=16, output_len=8)


@dataclass(frozen=True)
class Row:
    server: str
    precision: str
    workload: str
    result: Result


def run_server(server: Server, workloads: list[Workload], args: argparse.Namespace, log_dir: Path) -> list[Row]:
    """Start `server`, run each workload against it, stop it (also on failure)."""
    use_vllm_client = args.client == "vllm" or (args.client == "auto" and peer_installs.vllm_installed())
    server.start(log_dir)
    try:
        rows = []
        for workload in workloads:
            if use_vllm_client:
                result = vllm_bench(server, workload, args.model, warmups=args.warmups)
            else:
                result = builtin_client(server, workload)
            rows.append(Row(server.name, server.precision, workload.name, result))
            print(f"  {server.label}, {workload.name}: {result.output_throughput:.1f} tok/s", file=sys.stderr)
        return rows
    finally:
        server.stop()


def ratio_cell(rows: list[Row], row: Row) -> str:
    """Turnout's throughput over this row's, for the same precision and workload."""
    turnout = [r for r in rows if r.server == "turnout" and (r.precision, r.workload) == (row.precision, row.workload)]
    if not turnout or row.server == "turnout":
        return ""
    return f"{turnout[0].result.output_throughput / row.result.output_throughput:.2f}x"


def table(rows: list[Row]) -> str:
    lines = [
        "| server | precision | workload | output tok/s | median TTFT ms | median TPOT ms | Turnout / this |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        r = row.result
        tokens = "" if r.tokens_ok else f" (**{r.output_tokens} of {r.expected_tokens} tokens**)"
        lines.append(
            f"| {row.server} | {row.precision} | {row.workload} | {r.output_throughput:.1f}{tokens} "
            f"| {r.median_ttft_ms:.0f} | {r.median_tpot_ms:.1f} | {ratio_cell(rows, row)} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="HF folder (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--servers", default=",".join(SERVERS), help=f"comma-separated subset of {SERVERS}")
    parser.add_argument("--precisions", default=",".join(PRECISIONS), help=f"comma-separated subset of {PRECISIONS}")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated subset of {list(WORKLOADS)}")
    parser.add_argument("--num-prompts", type=int, default=None, help="requests per workload (default: per workload)")
    parser.add_argument("--warmups", type=int, default=2, help="requests sent before each measured workload")
    parser.add_argument(
        "--llama-threads", type=int, default=None, help="llama-server's -t (default: every core; 1 on a busy machine)"
    )
    parser.add_argument("--smoke", action="store_true", help="Turnout float32 only, one tiny workload")
    parser.add_argument(
        "--client",
        default="auto",
        choices=("auto", "vllm", "builtin"),
        help="auto: `vllm bench serve` where the peers' venv is installed (always, outside --smoke)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument("--log-dir", type=Path, default=None, help="server logs (default: a temporary folder)")
    args = parser.parse_args(argv)
    for name, allowed in (("servers", SERVERS), ("precisions", PRECISIONS), ("workloads", tuple(WORKLOADS))):
        chosen = [s for s in getattr(args, name).split(",") if s]
        if unknown := [s for s in chosen if s not in allowed]:
            parser.error(f"--{name}: unknown {unknown}; choose from {', '.join(allowed)}")
        setattr(args, name, chosen)
    return args


def main(argv: list[str] | None = None) -> list[Row]:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not one line per health poll
    args = parse_args(argv)
    if args.model is None:
        from turnout.default_model import prepare_default_model

        args.model = prepare_default_model()
    if not args.smoke and args.client == "builtin":
        raise SystemExit("--client builtin is for --smoke only: measured runs use `vllm bench serve`")
    if args.smoke:
        args.servers, args.precisions, workloads, args.warmups = ["turnout"], ["float32"], [SMOKE], 0
    else:
        workloads = [WORKLOADS[w] for w in args.workloads]
    if args.num_prompts is not None:
        workloads = [Workload(**{**asdict(w), "num_prompts": args.num_prompts}) for w in workloads]
    if not args.smoke:
        args.client = "vllm"
        peer_installs.install_vllm()
    # Install and build everything first, so no server waits on a build.
    servers = [prepare(s, args.model, p, args.llama_threads) for s in args.servers for p in args.precisions]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        log_dir = args.log_dir or Path(tmp)
        log_dir.mkdir(parents=True, exist_ok=True)
        failed = []
        for server in servers:
            print(f"{server.label}: starting", file=sys.stderr)
            try:
                rows += run_server(server, workloads, args, log_dir)
            except (subprocess.SubprocessError, RuntimeError, TimeoutError, OSError) as error:
                # One broken server must not cost the others' numbers; the end of its log says why.
                failed.append(f"{server.label}: {error}")
                if server.log_path is not None and server.log_path.exists():
                    print(server.log_path.read_text(errors="replace")[-4000:], file=sys.stderr)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2))
    if failed:
        raise SystemExit("failed:\n" + "\n".join(failed))
    return rows


if __name__ == "__main__":
    main()
