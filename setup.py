"""Build hook: generate the gRPC stubs while building, so `pip install .` works from a clone."""

from __future__ import annotations

import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithStubs(build_py):
    def run(self) -> None:
        super().run()
        sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
        from gen_proto import generate

        generate(Path(self.build_lib) / "keda_gpu_scaler" / "externalscaler")


setup(cmdclass={"build_py": BuildPyWithStubs})
