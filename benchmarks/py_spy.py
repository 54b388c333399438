"""The py-spy the benchmarks' profiles run: this venv's, else one on the PATH, else one installed once into the
peers' cache venv (never into this one: a profiler is not a dependency of the stack)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

PY_SPY_VERSION = "0.4.3"


def py_spy() -> Path:
    found = Path(sys.executable).parent / "py-spy"
    if found.exists():
        return found
    on_path = shutil.which("py-spy")
    if on_path is not None:
        return Path(on_path)
    from benchmarks import peer_installs

    venv = peer_installs.vllm_venv()
    if not (venv / "bin" / "py-spy").exists():
        if not (venv / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        subprocess.run([venv / "bin" / "python", "-m", "pip", "install", "-q", f"py-spy=={PY_SPY_VERSION}"], check=True)
    return venv / "bin" / "py-spy"
