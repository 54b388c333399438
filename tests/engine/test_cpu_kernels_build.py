"""Where the CPU kernels are built: a folder per checkout and kernel sources, and a lock a
dead builder cannot leave behind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from services.engine import cpu_kernels
from services.engine.cpu_kernels import NAME, build_dir, digest, load

ROOT = Path(__file__).resolve().parents[2]


def test_another_checkout_of_the_same_sources_builds_in_its_own_folder(tmp_path: Path) -> None:
    copy = tmp_path / "services" / "engine" / "cpu_kernels"
    copy.parent.mkdir(parents=True)
    subprocess.run(["cp", "-r", str(Path(cpu_kernels.__file__).parent), str(copy)], check=True)
    (tmp_path / "services" / "__init__.py").touch()
    (tmp_path / "services" / "engine" / "__init__.py").touch()
    code = "from services.engine.cpu_kernels import digest; print(digest())"
    other = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)}, capture_output=True, text=True
    )
    assert other.returncode == 0, other.stderr
    assert other.stdout.strip() != digest()


@pytest.mark.skipif(load() is None, reason="the CPU kernels could not be built here")
def test_a_lock_left_by_a_killed_build_does_not_block_the_next_load() -> None:
    folder = build_dir() / f"{NAME}_{digest()}"
    (folder / "lock").touch()  # what torch's baton leaves when its builder is killed
    code = "from services.engine.cpu_kernels import load; import sys; sys.exit(0 if load() else 1)"
    # Without the flock this waits for ever on torch's lock file; the timeout makes that a failure.
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=600)
    assert not (folder / "lock").exists()
