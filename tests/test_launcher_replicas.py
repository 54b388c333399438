"""`turnout serve --engines N`: the children it would start (no processes are started here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from turnout import launcher


def stack_for(monkeypatch: pytest.MonkeyPatch, argv: list[str], gpus: str | None) -> launcher.Stack:
    if gpus is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        monkeypatch.setattr(launcher.shutil, "which", lambda name: None)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", gpus)
    args = launcher.build_parser().parse_args(["--model", "/m", *argv])
    return launcher.build_stack(args, Path("/m"))


def option_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_one_engine_per_gpu_and_the_router_knows_them_all(monkeypatch: pytest.MonkeyPatch) -> None:
    stack = stack_for(monkeypatch, ["--engines", "3", "--engine-port", "7000", "--policy", "least_load"], "4,5")
    names = [c.name for c in stack.children]
    assert names == ["engine0", "engine1", "engine2", "tokenizer", "router", "gateway"]
    engines, router = stack.children[:3], stack.children[4]
    assert [c.env for c in engines] == [{"CUDA_VISIBLE_DEVICES": g} for g in ("4", "5", "4")]
    assert [option_values(c.argv, "--port") for c in engines] == [["7000"], ["7001"], ["7002"]]
    assert option_values(router.argv, "--engine") == ["127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"]
    assert option_values(router.argv, "--policy") == ["least_load"]
    assert [c.stage for c in stack.children] == [0, 0, 0, 0, 1, 1]


@pytest.mark.parametrize(("argv", "gpus"), [(["--engines", "2"], None), (["--engines", "2", "--device", "cpu"], "0,1")])
def test_cpu_replicas_split_the_cores_instead_of_pinning_gpus(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], gpus: str | None
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(launcher.os, "cpu_count", lambda: 8)
    stack = stack_for(monkeypatch, argv, gpus)
    assert [c.env for c in stack.children[:2]] == [{"OMP_NUM_THREADS": "4"}] * 2
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's choice wins
    stack = stack_for(monkeypatch, argv, gpus)
    assert [c.env for c in stack.children[:2]] == [{}, {}]


def test_default_is_one_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    stack = stack_for(monkeypatch, [], None)
    assert [c.name for c in stack.children] == ["engine", "tokenizer", "router", "gateway"]


def test_tensor_parallel_engines_get_their_own_gpus_and_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    stack = stack_for(monkeypatch, ["--engines", "2", "--tp-size", "2", "--distributed-backend", "nccl"], "0,1,2,3")
    engines = stack.children[:2]
    assert [c.env for c in engines] == [{"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "2,3"}]
    for engine in engines:
        assert option_values(engine.argv, "--tensor-parallel-size") == ["2"]
        assert option_values(engine.argv, "--distributed-backend") == ["nccl"]
    one = stack_for(monkeypatch, ["--tensor-parallel-size", "2"], "0,1")
    assert one.children[0].env == {}  # one engine sees both GPUs: its ranks take cuda:0 and cuda:1
    plain = stack_for(monkeypatch, [], None)
    assert "--tensor-parallel-size" not in plain.children[0].argv
