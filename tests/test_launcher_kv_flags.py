"""`turnout serve` passes the KV pool's size on to every engine."""

from __future__ import annotations

from pathlib import Path

from services.engine.main import build_parser as engine_parser
from turnout import launcher


def engine_args(argv: list[str]) -> list[object]:
    stack = launcher.build_stack(launcher.build_parser().parse_args(["--model", "/m", *argv]), Path("/m"))
    engines = [child for child in stack.children if child.name.startswith("engine")]
    return [engine_parser().parse_args(e.argv[e.argv.index("engine") + 1 :]) for e in engines]


def test_kv_pool_flags_reach_every_engine() -> None:
    engines = engine_args(["--engines", "2", "--kv-cache-memory", "1.5", "--num-kv-blocks", "300"])
    assert len(engines) == 2
    for args in engines:
        assert args.kv_cache_memory_gib == 1.5 and args.num_kv_blocks == 300  # type: ignore[attr-defined]
    (plain,) = engine_args([])
    assert plain.kv_cache_memory_gib is None and plain.num_kv_blocks is None  # type: ignore[attr-defined]
