"""The engine's Triton kernels compiled ahead of time for NVIDIA GPUs, on a machine without one.

For every model in MODELS and dtype in DTYPES, the calls of services/engine/kernels/launch_table.py
run on "meta" tensors with Triton pointed at a GPU that is not there (`_FakeDevice`) and its
`jit_cache_hook` answering "compiled already": Triton's own launch path binds the arguments and
specialises them exactly as it would on that GPU (argument types, divisibility, constexprs,
num_warps) and hands the result to the hook, which keeps it instead of compiling. Identical
specialisations are merged; each one left is compiled by `triton.compile` for the target
architecture, with the `ptxas` the Triton wheel ships.

Registers and spills come from ptxas's own report (`knobs.nvidia.dump_ptxas_log`): this Triton
reads `n_regs` / `n_spills` from the CUDA driver when a kernel is loaded onto a GPU, so without one
they are not in its metadata. Shared memory is the metadata's `shared` (what Triton checks
against the device's limit before a launch). Results are cached under
`cache_root()/kernel-aot/triton-<version>/`, keyed by Triton's own compile key (Triton and ptxas
versions, the kernel's source and the functions it calls, options, environment), so a warm run
compiles nothing and any change to a kernel compiles it again.

    python -m benchmarks.kernel_aot [--arch 80 90 100] [--jobs N] --json PATH

needs the kernels compiled, not interpreted: TRITON_INTERPRET must not be set.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import importlib
import io
import json
import os
import pkgutil
import re
import subprocess
import tempfile
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import torch
import triton
from triton import knobs
from triton._C.libtriton import get_cache_invalidating_env_vars
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.cache import get_cache_key
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction

import services.engine.kernels as kernels_package
from benchmarks.gpu_occupancy import ARCHS
from benchmarks.model_shapes import SHAPES, ModelShape
from services.engine.kernels import interpreting
from services.engine.kernels.launch_table import engine_calls
from turnout.default_model import cache_root

# The default model (SmolLM2-135M-Instruct) and the two benchmark shapes.
MODELS: dict[str, ModelShape] = {
    "smollm2-135m": SHAPES["135m"],
    "llama-3.2-1b": SHAPES["1b"],
    "llama-3.1-8b": SHAPES["8b"],
}
# The engine's CUDA dtypes: bfloat16 and float16 (`--dtype auto` picks one), float32 (`--dtype float32`).
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_PTXAS_REGISTERS = re.compile(r"Used (\d+) registers")
# SASS lines as cuobjdump prints them: "/*0970*/   STL [R1], R29 ;", "/*8e30*/   @P0 BRA 0x36b0 ;"
_SASS_LINE = re.compile(r"/\*([0-9a-f]+)\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"


@dataclass
class Specialisation:
    """One kernel variant Triton would compile for one architecture, and where the engine launches it."""

    module: str
    kernel: str
    arch: int
    signature: dict[str, str]  # argument -> Triton type ("*bf16", "i32", "constexpr", ...)
    constants: dict[str, Any]  # argument -> value: the declared constexprs and ints specialised to 1
    attrs: dict[str, list[Any]]  # argument -> Triton's attributes, e.g. [["tt.divisibility", 16]]
    options: dict[str, Any]  # Triton's compile options (num_warps, num_stages, ...)
    cache_key: str  # Triton's own compile key, hashed
    sources: list[str] = field(default_factory=list)  # "llama-3.1-8b bf16: paged_decode (decode, eager, 25 blocks)"

    @property
    def num_warps(self) -> int:
        return int(self.options["num_warps"])

    @property
    def dtype(self) -> str:
        """The element type of its float tensors, float32 side buffers (partial sums, frequencies)
        aside: "bf16", "fp16", or "fp32" when every float tensor is float32."""
        floats = {t[1:] for t in self.signature.values() if t.startswith(("*bf", "*fp"))}
        return "/".join(sorted(floats - {"fp32"} or floats)) or "-"

    @property
    def label(self) -> str:
        """The declared constexprs as NAME=value, the warps, and the int arguments specialised to 1."""
        declared = [f"{k}={v}" for k, v in self.constants.items() if k.isupper()]
        ones = [k for k in self.constants if not k.isupper()]
        return " ".join([*declared, f"warps={self.num_warps}"]) + (f" ({', '.join(ones)} = 1)" if ones else "")

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "constants": {k: _plain(v) for k, v in self.constants.items()}}


@dataclass
class Resources:
    """What ptxas made of one specialisation; `error` when it did not compile."""

    registers: int = 0
    spill_stores: int = 0  # bytes
    spill_loads: int = 0
    stack_bytes: int = 0
    # Local-memory loads and stores (STL / LDL) inside a loop of the SASS, executed every iteration;
    # only counted when ptxas reports spills.
    spills_in_loops: int = 0
    shared_bytes: int = 0  # Triton's metadata.shared: dynamic shared memory per block
    seconds: float = 0.0
    error: str | None = None

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


class _FakeDevice:
    """The few driver calls Triton's launch path makes before compiling, answered for a GPU of
    compute capability `arch` that is not there."""

    def __init__(self, arch: int) -> None:
        self.target = GPUTarget("cuda", arch, 32)

    def get_current_device(self) -> str:
        return f"aot-sm{self.target.arch}"  # one binder cache per architecture

    def get_current_stream(self, device: object = None) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return self.target


@contextlib.contextmanager
def _specialising_for(arch: int) -> Iterator[list[tuple[JITFunction, dict[str, Any]]]]:
    """Within: every Triton launch is specialised for `arch` and recorded (kernel, the hook's
    compile arguments) instead of compiled and run."""
    found: list[tuple[JITFunction, dict[str, Any]]] = []

    def record(*, fn: Any, compile: dict[str, Any], **_: Any) -> bool:
        found.append((fn.jit_function, compile))
        return True  # "handled": Triton compiles nothing and launches nothing

    previous = driver._active  # reading driver.active would look for a GPU
    driver.set_active(_FakeDevice(arch))  # type: ignore[arg-type]
    try:
        with knobs.runtime.scope():
            knobs.runtime.jit_cache_hook = record
            yield found
    finally:
        driver._active = previous


def specialisations(
    arch: int, models: dict[str, ModelShape] = MODELS, launchers: set[str] | None = None
) -> list[Specialisation]:
    """Every distinct kernel variant the launch table makes for these models and DTYPES on `arch`
    (only the calls of `launchers`, e.g. {"rms_norm"}, when given)."""
    backend = make_backend(GPUTarget("cuda", arch, 32))
    env_vars = get_cache_invalidating_env_vars()
    by_key: dict[str, Specialisation] = {}
    for model_name, shape in models.items():
        for dtype_name, dtype in DTYPES.items():
            for call in engine_calls(shape, dtype):
                if launchers is not None and call.launcher not in launchers:
                    continue
                with _specialising_for(arch) as launches:
                    call.run()
                for fn, args in launches:
                    options = backend.parse_options(_tuples(json.loads(args["specialization_data"])["options"]))
                    src = ASTSource(fn, args["signature"], args["constants"], args["configs"][0])
                    key = hashlib.sha256(get_cache_key(src, backend, options, env_vars).encode()).hexdigest()
                    if key not in by_key:
                        by_key[key] = _describe(fn, arch, args, options.__dict__, key)
                    by_key[key].sources.append(f"{model_name} {dtype_name}: {call.launcher} ({call.step})")
    return list(by_key.values())


def _describe(fn: JITFunction, arch: int, args: dict[str, Any], options: dict[str, Any], key: str) -> Specialisation:
    names = fn.arg_names
    return Specialisation(
        module=fn.module,
        kernel=fn.__name__,
        arch=arch,
        signature=dict(args["signature"]),
        constants={names[path[0]]: value for path, value in args["constants"].items()},
        attrs={names[path[0]]: attrs for path, attrs in args["configs"][0].items()},
        options={k: _plain(v) for k, v in options.items()},
        cache_key=key,
    )


def _plain(value: Any) -> Any:
    """A JSON-friendly copy of a constexpr or option value."""
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


def _tuples(options: dict[str, Any]) -> dict[str, Any]:
    """Options as Triton parses them (JSON turned its tuples into lists)."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}


def compile_spec(spec: Specialisation) -> Any:
    """`spec` compiled by Triton for its architecture, exactly as its launch would compile it (the
    result's `asm` holds the PTX and cubin, `hash` Triton's key)."""
    fn = getattr(importlib.import_module(spec.module), spec.kernel)
    names = fn.arg_names
    constants = {(names.index(k),): v for k, v in spec.constants.items()}
    attrs = {(names.index(k),): v for k, v in spec.attrs.items()}
    source = ASTSource(fn, spec.signature, constants, attrs)
    return triton.compile(source, target=GPUTarget("cuda", spec.arch, 32), options=_tuples(spec.options))


def compile_one(spec: Specialisation) -> Resources:
    """Compile `spec` with Triton for its architecture; ptxas's report gives registers and spills."""
    log = io.StringIO()
    started = time.perf_counter()
    try:
        with contextlib.ExitStack() as scopes:
            scopes.enter_context(warnings.catch_warnings())
            warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION")
            scopes.enter_context(knobs.nvidia.scope())
            scopes.enter_context(knobs.compilation.scope())
            scopes.enter_context(contextlib.redirect_stdout(log))
            knobs.nvidia.dump_ptxas_log = True  # printed to stdout, which `log` catches
            knobs.compilation.always_compile = True  # a hit in Triton's cache would print no report
            kernel = compile_spec(spec)
    except Exception as error:  # any compile failure is a result to report, not a crash
        return Resources(seconds=time.perf_counter() - started, error=f"{type(error).__name__}: {error}"[:2000])
    if kernel.hash != spec.cache_key:  # Triton's own key: what compiled is not what the launch would compile
        return Resources(error=f"compiled {kernel.hash}, the launch's specialisation is {spec.cache_key}")
    report = log.getvalue()
    frame, registers = _PTXAS_FRAME.search(report), _PTXAS_REGISTERS.search(report)
    if frame is None or registers is None:
        return Resources(error=f"no ptxas report in the compile's output: {report[:500]!r}")
    resources = Resources(
        registers=int(registers.group(1)),
        stack_bytes=int(frame.group(1)),
        spill_stores=int(frame.group(2)),
        spill_loads=int(frame.group(3)),
        shared_bytes=int(kernel.metadata.shared),
    )
    if resources.spills:
        resources.spills_in_loops = spills_in_loops(kernel.asm["cubin"])
    resources.seconds = time.perf_counter() - started
    return resources


def spills_in_loops(cubin: bytes) -> int:
    """STL / LDL instructions of `cubin` that lie inside a loop: between a backward branch and its
    target. Out-of-line slow paths (IEEE division, sin/cos argument reduction) sit after the
    kernel's EXIT and count as outside, as they run only for rare arguments."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        sass = subprocess.run([CUOBJDUMP, "-sass", file.name], capture_output=True, text=True, check=True).stdout
    return spills_in_sass_loops(sass)


def spills_in_sass_loops(sass: str) -> int:
    """spills_in_loops on cuobjdump's SASS listing."""
    instructions = [(int(m[1], 16), m[2], m[3]) for m in _SASS_LINE.finditer(sass)]
    loops = []
    for address, opcode, operands in instructions:
        target = re.match(r"0x([0-9a-f]+)", operands.strip())
        if opcode.startswith("BRA") and target and int(target[1], 16) < address:
            loops.append((int(target[1], 16), address))
    spills = [address for address, opcode, _ in instructions if opcode.split(".")[0] in ("STL", "LDL")]
    return sum(any(start <= address <= end for start, end in loops) for address in spills)


def cache_dir() -> Path:
    return cache_root() / "kernel-aot" / f"triton-{triton.__version__}"


def compile_all(specs: list[Specialisation], jobs: int = 1) -> list[Resources]:
    """Resources of every specialisation: from the cache, else compiled (in `jobs` processes) and cached.
    Failed compiles are not cached: a later run tries again."""
    folder = cache_dir()
    found: dict[int, Resources] = {}
    for i, spec in enumerate(specs):
        path = folder / f"{spec.cache_key}.json"
        if path.is_file():
            found[i] = Resources(**json.loads(path.read_text()))
    todo = [i for i in range(len(specs)) if i not in found]
    if todo:
        folder.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as stack:
            if jobs > 1 and len(todo) > 1:
                # fork: the workers start with torch and triton imported; nothing here has started threads
                pool = stack.enter_context(ProcessPoolExecutor(min(jobs, len(todo)), mp_context=get_context("fork")))
                compiled = pool.map(compile_one, [specs[i] for i in todo])
            else:
                compiled = map(compile_one, [specs[i] for i in todo])
            for i, resources in zip(todo, compiled, strict=True):
                found[i] = resources
                if resources.error is None:
                    _write_atomically(folder / f"{specs[i].cache_key}.json", json.dumps(asdict(resources)))
    return [found[i] for i in range(len(specs))]


def _write_atomically(path: Path, text: str) -> None:
    """Concurrent runs (test workers) may write the same entry: each renames a whole file into place."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(text)
    partial.replace(path)


def jit_functions() -> dict[str, JITFunction]:
    """Every @triton.jit function of services/engine/kernels, by "module:name"."""
    found: dict[str, JITFunction] = {}
    for info in pkgutil.iter_modules(kernels_package.__path__, f"{kernels_package.__name__}."):
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if isinstance(value, JITFunction) and value.module == module.__name__:
                found[f"{module.__name__}:{name}"] = value
    return found


def uncovered(launched: set[str]) -> list[str]:
    """The package's JIT functions ("module:name") that no launch compiles: neither launched
    themselves nor called from a launched kernel (helpers such as rotary's _rotate_heads)."""
    everything = jit_functions()
    covered: set[str] = set()
    pending = [name for name in launched if name in everything]
    while pending:
        name = pending.pop()
        if name in covered:
            continue
        covered.add(name)
        pending += _callees(everything[name])
    return sorted(set(everything) - covered)


def _callees(fn: JITFunction) -> list[str]:
    """The JIT functions `fn`'s body calls by name ("module:name")."""
    calls = [node for node in ast.walk(ast.parse(fn.src)) if isinstance(node, ast.Call)]
    names = {call.func.id for call in calls if isinstance(call.func, ast.Name)}
    scope = fn.fn.__globals__
    return [f"{scope[n].module}:{scope[n].__name__}" for n in names if isinstance(scope.get(n), JITFunction)]


@dataclass
class Unit:
    """One specialisation for one architecture, and what ptxas made of it."""

    spec: Specialisation
    resources: Resources

    def to_json(self) -> dict[str, Any]:
        return {"specialisation": self.spec.to_json(), "resources": asdict(self.resources)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Unit:
        return cls(Specialisation(**data["specialisation"]), Resources(**data["resources"]))


@dataclass
class AotRun:
    archs: list[int]
    units: list[Unit]
    jit_functions: list[str]  # every @triton.jit function of the package, "module:name"
    uncovered: list[str]  # those no launch compiles
    seconds: float
    triton: str = triton.__version__

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "units": [u.to_json() for u in self.units]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AotRun:
        return cls(**{**data, "units": [Unit.from_json(u) for u in data["units"]]})


def run(archs: list[int], jobs: int = 1, launchers: set[str] | None = None) -> AotRun:
    """Specialise and compile every launch of the table (of `launchers` only, when given) for each
    architecture in `archs`."""
    if interpreting():
        raise RuntimeError("TRITON_INTERPRET=1 is set: the kernels are interpreted here, there is nothing to compile")
    started = time.perf_counter()
    units = []
    for arch in archs:
        specs = specialisations(arch, MODELS, launchers)
        units += [Unit(s, r) for s, r in zip(specs, compile_all(specs, jobs), strict=True)]
    launched = {f"{u.spec.module}:{u.spec.kernel}" for u in units}
    missing = uncovered(launched) if launchers is None else []  # a subset leaves the others out on purpose
    return AotRun(list(archs), units, sorted(jit_functions()), missing, time.perf_counter() - started)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, nargs="+", choices=sorted(ARCHS), default=sorted(ARCHS))
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="compiles at once")
    parser.add_argument("--launcher", nargs="+", default=None, help="only these launchers' calls, e.g. rms_norm")
    parser.add_argument("--json", type=Path, required=True, help="write the specialisations and their resources here")
    args = parser.parse_args(argv)
    launchers = set(args.launcher) if args.launcher else None
    args.json.write_text(json.dumps(run(args.arch, args.jobs, launchers).to_json(), indent=1))


if __name__ == "__main__":
    main()
