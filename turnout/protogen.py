"""Generate the Python modules of the wire contract from `proto/` with grpcio-tools.

Run by the package build (see setup.py) and by `make proto`. Output goes next to
this file in `turnout/v1/`, so `from turnout.v1 import engine_pb2` works.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
OUT_DIR = ROOT


def proto_files() -> list[Path]:
    return sorted((PROTO_DIR / "turnout" / "v1").glob("*.proto"))


def generate() -> None:
    """Compile every .proto into *_pb2.py, *_pb2.pyi and *_pb2_grpc.py."""
    import grpc_tools
    from grpc_tools import protoc

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"-I{well_known}",
        f"--python_out={OUT_DIR}",
        f"--pyi_out={OUT_DIR}",
        f"--grpc_python_out={OUT_DIR}",
        *[str(p) for p in proto_files()],
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {PROTO_DIR}")


if __name__ == "__main__":
    generate()
    sys.exit(0)
