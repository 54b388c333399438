"""C++ kernels of the CPU path, built on this machine for this machine.

`turnout install` (make install) builds them once with torch's extension builder (g++, ninja,
-O3 -march=native); an engine that finds them unbuilt builds them at start, and one that cannot
(no compiler) logs why and keeps the portable torch path, which is also the reference the tests
hold them to. The build lands under ~/.cache/turnout/torch_extensions (TURNOUT_CPU_KERNELS_DIR
overrides) in a folder named by a digest of the sources, their folder and the flags: an edited
kernel gets a new build, and two checkouts never rebuild over each other (torch's build files
name the sources by absolute path, so a second checkout of the same sources would rebuild the
first one's folder, and the first would rebuild it back).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import os
import time
from pathlib import Path
from types import ModuleType

log = logging.getLogger(__name__)

FILES = (
    "module.cpp",
    "paged_decode.cpp",
    "paged_prefill.cpp",
    "packed_linear.cpp",
    "elementwise.cpp",
    "decoder.cpp",
    "argmax.cpp",
    "common.h",
    "simd.h",
    "ops.h",
)
SOURCES = tuple(Path(__file__).with_name(name) for name in FILES if name.endswith(".cpp"))
# Sources and the header they include: what the build's digest covers.
INPUTS = tuple(Path(__file__).with_name(name) for name in FILES)
NAME = "turnout_cpu_kernels"
FLAGS = ("-O3", "-march=native", "-fopenmp")


def build_dir() -> Path:
    default = Path.home() / ".cache" / "turnout" / "torch_extensions"
    return Path(os.environ.get("TURNOUT_CPU_KERNELS_DIR", default))


def digest() -> str:
    """Of the sources and where they are, the flags and torch's version: what the build depends on."""
    import torch

    h = hashlib.sha256()
    h.update(str(Path(__file__).resolve().parent).encode())
    for source in INPUTS:
        h.update(source.read_bytes())
    h.update(" ".join(FLAGS).encode())
    h.update(torch.__version__.encode())
    h.update(_cpu_flags().encode())  # -march=native: a build serves only CPUs like this one
    return h.hexdigest()[:12]


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            return next((line for line in info if line.startswith("flags")), "")
    except OSError:
        return ""


@functools.cache
def load() -> ModuleType | None:
    """The built extension (building it first when needed); None, with the reason logged, when it cannot be built."""
    try:
        from torch.utils import cpp_extension

        name = f"{NAME}_{digest()}"
        directory = build_dir() / name
        directory.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        # torch's own lock is a file that a killed build leaves behind, and then every later load
        # waits on it for ever. Every loader of this folder holds this flock first, which the OS
        # releases when its holder dies, so a torch lock found while holding it is a dead one's.
        with open(directory / "turnout.lock", "w") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            (directory / "lock").unlink(missing_ok=True)
            module = cpp_extension.load(
                name=name,
                sources=[str(s) for s in SOURCES],
                extra_cflags=list(FLAGS),
                extra_ldflags=["-fopenmp"],
                build_directory=str(directory),
                verbose=False,
            )
    except Exception as exc:  # a missing compiler or ninja, a failed build: the torch path serves
        log.warning("CPU kernels unavailable; the engine uses its torch paths", extra={"reason": str(exc)[-500:]})
        return None
    log.info("CPU kernels ready", extra={"seconds": round(time.monotonic() - started, 1)})
    return module
