"""Build hook: the gRPC stubs in turnout/v1/ are generated from proto/ at build time."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildWithProtos(build_py):  # type: ignore[misc]
    def run(self) -> None:
        # Load protogen by path: the package itself is not importable during the build.
        path = Path(__file__).parent / "turnout" / "protogen.py"
        spec = importlib.util.spec_from_file_location("turnout_protogen", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.generate()
        super().run()


setup(cmdclass={"build_py": BuildWithProtos})
