"""`pip install .` from a clone: the build hook generates the stubs, the package imports them, the command runs."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(ROOT)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if build.returncode != 0 and "No matching distribution" in build.stderr:
        pytest.skip(f"the build requirements cannot be fetched here: {build.stderr.strip()[-300:]}")
    assert build.returncode == 0, build.stderr
    (found,) = out.glob("keda_gpu_scaler-*.whl")
    return found


def test_wheel_contains_generated_stubs_importing_by_package_path(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert "keda_gpu_scaler/_proto/externalscaler_pb2.py" in names
        grpc_module = archive.read("keda_gpu_scaler/_proto/externalscaler_pb2_grpc.py").decode()
        entry_points = next(archive.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    assert "from . import externalscaler_pb2 as" in grpc_module
    assert "\nimport externalscaler_pb2" not in grpc_module
    assert "keda-gpu-scaler = keda_gpu_scaler.cli:main" in entry_points


def test_installed_package_runs(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        timeout=300,
    )
    # Run from an empty directory with only the installed copy on the path, never the source tree.
    env = {**os.environ, "PYTHONPATH": str(target)}
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import keda_gpu_scaler, sys; from keda_gpu_scaler.cli import main; sys.exit(main())",
            "serve",
            "--help",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "--exporter-url" in result.stdout
    located = subprocess.run(
        [
            sys.executable,
            "-c",
            "import keda_gpu_scaler._proto.externalscaler_pb2_grpc as m; print(m.__file__)",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        check=True,
        timeout=60,
    )
    assert located.stdout.strip().startswith(str(target))
