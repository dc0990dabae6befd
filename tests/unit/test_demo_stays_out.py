"""The demo (`keda-gpu-scaler demo`, a simulated fleet) is no part of the server: the server's modules never
import it, and the container image leaves it out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from keda_gpu_scaler.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_the_server_and_its_command_line_import_no_demo_module() -> None:
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, keda_gpu_scaler.cli, keda_gpu_scaler.app;"
            " print(sorted(m for m in sys.modules if m.startswith('keda_gpu_scaler.demo')))",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert loaded.stdout.strip() == "[]"


def test_the_image_leaves_the_demo_out_and_its_build_checks_that() -> None:
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert ignored.index("keda_gpu_scaler/demo/") > ignored.index("!keda_gpu_scaler/")  # the later rule wins
    assert 'assert "keda_gpu_scaler.demo" not in modules' in (ROOT / "Dockerfile").read_text()


def test_the_demo_command_without_the_demo_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # As in the image: not importable, even where another test of this process has imported it already.
    for name in ["keda_gpu_scaler.demo", "keda_gpu_scaler.demo.runner", *sys.modules]:
        if name.startswith("keda_gpu_scaler.demo"):
            monkeypatch.setitem(sys.modules, name, None)
    assert main(["demo"]) == 2
    assert (
        "the demo is not in this installation (the container image leaves it out)" in capsys.readouterr().err
    )
