"""Grammar compiles in worker processes: a pathological schema runs into --grammar-compile-timeout
and its worker is killed and replaced; a compile nobody waits for any more is stopped; a worker
that crashes is replaced; a grammar that matches nothing is refused at compile time; a worker
starts while the engine makes the TokenizerInfo it needs."""

from __future__ import annotations

import gc
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from services.engine.grammar import xgrammar_build
from services.engine.grammar.compile_worker import CompileWorker
from services.engine.grammar.compiler import CompileCancelled, GrammarCompiler
from services.engine.grammar.constraint import Constraint
from services.engine.model_loader import LoadedModel, load_model
from services.engine.vocab import ModelVocab
from tests.engine.grammar_builds import crashing_build
from turnout.errors import InvalidArgument

TIMEOUT_S = 3.0
# 1,500 nested arrays: xgrammar needs minutes for it (compile time grows steeply with depth); the
# engine's --max-grammar-depth refuses it before compiling, the compiler itself does not check.
PATHOLOGICAL = Constraint("json_schema", '{"type": "array", "items": ' * 1500 + '{"type": "string"}' + "}" * 1500)
DIGITS = Constraint("regex", "[0-9]{3}")


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path) -> LoadedModel:
    from services.engine.config import EngineConfig

    return load_model(EngineConfig(model=tiny_model_dir))


@pytest.fixture(scope="module")
def vocab(loaded: LoadedModel, tiny_model_dir: Path) -> ModelVocab:
    return ModelVocab(tiny_model_dir, loaded.vocab_size, loaded.eos_token_ids)


@pytest.fixture(scope="module")
def compiler(vocab: ModelVocab) -> Iterator[GrammarCompiler]:
    compiler = GrammarCompiler(vocab, timeout_s=TIMEOUT_S, workers=1)
    compiler.compile(DIGITS)  # the worker is up
    yield compiler
    compiler.shutdown()


def wait_until(condition: Callable[[], object], what: str, timeout_s: float = 300) -> None:
    """Generous: starting a worker (spawn, import torch and xgrammar) takes 20 s and more on a busy machine."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_compile_over_the_time_limit_is_refused_and_its_worker_replaced(compiler: GrammarCompiler) -> None:
    before, replaced = compiler.worker_pids(), compiler.num_replaced
    started = time.monotonic()
    with pytest.raises(InvalidArgument, match=r"took longer than 3 s \(the server's --grammar-compile-timeout\)"):
        compiler.compile(PATHOLOGICAL)
    assert time.monotonic() - started < 60  # bounded by the limit, not by the schema
    wait_until(lambda: compiler.num_replaced == replaced + 1, "the worker to be killed")
    wait_until(lambda: compiler.worker_pids() not in ([], before), "a new worker")
    assert compiler.compile(Constraint("regex", "[a-c]{2}")) is not None  # the replacement works
    # Not cached: a timeout depends on the machine's load, so the same constraint is compiled again.
    compiled = compiler.num_compiled
    with pytest.raises(InvalidArgument, match="--grammar-compile-timeout"):
        compiler.compile(PATHOLOGICAL)
    assert compiler.num_compiled == compiled + 1


def test_a_compile_nobody_waits_for_is_stopped(compiler: GrammarCompiler) -> None:
    wait_until(lambda: len(compiler.worker_pids()) == 1, "the worker")
    before, replaced = compiler.worker_pids(), compiler.num_replaced
    with compiler.wanted(PATHOLOGICAL) as running:
        wait_until(running.running, "the compile to start")
        # A second one queued behind it (one worker): leaving drops it before it starts.
        with compiler.wanted(Constraint("regex", "[x-z]{4}")) as queued:
            pass
        assert queued.cancelled()
    with pytest.raises(CompileCancelled):
        running.result(timeout=30)  # well before the time limit would have ended it
    wait_until(lambda: compiler.num_replaced == replaced + 1, "the worker to be killed")
    wait_until(lambda: compiler.worker_pids() not in ([], before), "a new worker")
    assert compiler.compile(DIGITS) is not None


def test_a_compile_shared_by_two_requests_runs_while_either_waits(compiler: GrammarCompiler) -> None:
    constraint = Constraint("regex", "[0-9]{5}")
    with compiler.wanted(constraint) as first:
        with compiler.wanted(constraint) as second:
            assert first is second
        assert first.result(timeout=60) is not None  # the other request's leaving did not stop it


def test_a_grammar_that_matches_nothing_is_refused_at_compile(compiler: GrammarCompiler) -> None:
    # Not a plain $ref cycle (refused before compiling), but just as empty.
    empty = Constraint("json_schema", json.dumps({"allOf": [{"$ref": "#"}]}))
    with pytest.raises(InvalidArgument, match="json_schema: the constraint matches no output at all"):
        compiler.compile(empty)


def test_a_crashed_worker_is_replaced_and_a_dropped_compiler_stops_its_workers(vocab: ModelVocab) -> None:
    compiler = GrammarCompiler(vocab, timeout_s=30, workers=1, build=crashing_build)
    with pytest.raises(InvalidArgument, match="regex: the grammar compiler crashed on this constraint"):
        compiler.compile(Constraint("regex", "crash"))
    assert compiler.compile(DIGITS) is not None
    assert compiler.num_replaced == 1
    pids = [pid for pid in compiler.worker_pids() if pid is not None]
    assert pids
    del compiler  # an engine dropped without shutdown(): its slots hold it weakly and stop
    gc.collect()
    wait_until(lambda: not any(alive(pid) for pid in pids), "the worker to exit")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _new_workers(before: set[int]) -> list[int]:
    """Processes started by multiprocessing's spawn since `before` (its resource tracker is not one), alive.
    A process whose command line is still empty counts: `Process.start()` returns once the child's exec
    has closed its inherited descriptors, and the kernel sets the new command line a moment later, so a
    worker read at once may show none on a busy machine."""
    found = []
    for child in psutil.Process().children():
        try:
            if child.pid in before or child.status() == psutil.STATUS_ZOMBIE:
                continue
            command = child.cmdline()
            if not command or "spawn_main" in " ".join(command):
                found.append(child.pid)
        except psutil.NoSuchProcess:
            continue
    return found


def test_the_worker_starts_while_the_tokenizer_info_is_made(vocab: ModelVocab) -> None:
    """An engine's first grammar waits for loading the tokenizer and for a new process's imports side
    by side, not one after the other: the process is running by the time the TokenizerInfo is asked for."""
    before = {p.pid for p in psutil.Process().children()}
    running_meanwhile: list[int] = []

    def tokenizer_info_json() -> str:
        running_meanwhile.extend(_new_workers(before))
        return str(vocab.tokenizer_info.serialize_json())

    worker = CompileWorker(tokenizer_info_json, xgrammar_build.build)
    try:
        assert worker.process.pid in running_meanwhile
        assert worker.compile(DIGITS, timeout_s=120)  # and it compiles against that TokenizerInfo
    finally:
        worker.kill()


def test_a_tokenizer_info_that_cannot_be_made_leaves_no_worker_behind(vocab: ModelVocab) -> None:
    before = {p.pid for p in psutil.Process().children()}
    started: list[int] = []

    def no_tokenizer() -> str:
        started.extend(_new_workers(before))
        raise InvalidArgument("the served model's folder has no tokenizer files")

    with pytest.raises(InvalidArgument, match="no tokenizer files"):
        CompileWorker(no_tokenizer, xgrammar_build.build)
    assert started  # the worker was running when the TokenizerInfo failed
    wait_until(lambda: not set(started) & set(_new_workers(before)), "the started worker to be gone", timeout_s=30)
