"""One version, written once (keda_gpu_scaler/__init__.py): every other place that names it agrees."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import yaml

from keda_gpu_scaler import __version__

ROOT = Path(__file__).resolve().parents[2]
# The name the release workflow pushes the image under, and the chart and manifests default to.
RELEASED_IMAGE = "ghcr.io/keda-gpu-scaler/keda-gpu-scaler"
IMAGE_REFERENCE = re.compile(r"\bkeda-gpu-scaler:(\d+\.\d+\.\d+[\w.+-]*)")


def test_the_package_version_is_the_one_pyproject_reads() -> None:
    with (ROOT / "pyproject.toml").open("rb") as file:
        pyproject = tomllib.load(file)
    assert "version" not in pyproject["project"]
    assert "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "keda_gpu_scaler.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__)


def test_the_chart_deploys_this_version() -> None:
    chart = yaml.safe_load((ROOT / "charts/keda-gpu-scaler/Chart.yaml").read_text())
    assert chart["appVersion"] == __version__
    assert chart["version"] == __version__
    images = yaml.safe_load(chart["annotations"]["artifacthub.io/images"])
    assert [image["image"] for image in images] == [f"{RELEASED_IMAGE}:{__version__}"]
    values = yaml.safe_load((ROOT / "charts/keda-gpu-scaler/values.yaml").read_text())
    # The chart installs the released image: the repository the release workflow pushes to, the tag its
    # appVersion (an empty tag means appVersion).
    assert values["image"]["repository"] == RELEASED_IMAGE
    assert values["image"]["tag"] == ""


def test_every_kustomization_sets_this_image_tag() -> None:
    tags = {
        path.relative_to(ROOT).as_posix(): [
            (image.get("name"), image.get("newTag")) for image in document.get("images", [])
        ]
        for path in (ROOT / "manifests").rglob("kustomization.yaml")
        for document in [yaml.safe_load(path.read_text())]
        if document.get("images")
    }
    assert tags, "no kustomization sets the image"
    assert all(found == [(RELEASED_IMAGE, __version__)] for found in tags.values()), tags


def test_every_image_reference_in_manifests_charts_and_docs_is_this_version() -> None:
    tracked = subprocess.run(
        [
            "git",
            "ls-files",
            "manifests",
            "charts",
            "docs",
            ".github",
            "README.md",
            "CHANGELOG.md",
            "Makefile",
            "Dockerfile",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    stale = {
        f"{name}: {match.group(0)}"
        for name in tracked
        if (ROOT / name).suffix not in {".png", ".svg"}
        for match in IMAGE_REFERENCE.finditer((ROOT / name).read_text(errors="replace"))
        if match.group(1) != __version__
    }
    assert not stale, sorted(stale)


def test_the_newest_changelog_heading_is_this_version_as_its_tag() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    newest = re.search(r"^## (\S+)", changelog, re.MULTILINE)
    assert newest is not None and newest.group(1) == f"v{__version__}"


def test_make_image_tags_the_image_with_this_version() -> None:
    printed = subprocess.run(
        ["make", "-n", "image"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert f"-t keda-gpu-scaler:{__version__} " in printed
