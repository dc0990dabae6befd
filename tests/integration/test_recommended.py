"""One recommendation everywhere: the README, NOTES.txt, the CLI help, the demo and the examples say the
LLM triggers of keda_gpu_scaler.recommended, and the README describes each example as it renders."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from keda_gpu_scaler.cli import build_parser
from keda_gpu_scaler.demo.fleet import DemoFleet
from keda_gpu_scaler.demo.runner import banner, demo_targets
from keda_gpu_scaler.recommended import GUARD, LLM_TRIGGERS, SIZING, WAKE, Recommended, llm_summary

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
CHART = ROOT / "charts" / "keda-gpu-scaler"


def says(metadata: dict[str, Any], trigger: Recommended) -> bool:
    return all(str(metadata.get(key)) == value for key, value in trigger.metadata)


def yaml_blocks(text: str) -> list[Any]:
    return [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", text, re.S)]


def triggers_of(document: Any) -> list[dict[str, Any]]:
    spec = document.get("spec", document)
    return [t["metadata"] for t in spec["triggers"]]


def test_the_readme_recommends_the_trigger_set() -> None:
    blocks = [b for b in yaml_blocks(README) if isinstance(b, dict) and "triggers" in b.get("spec", b)]
    three = [triggers_of(b) for b in blocks if len(triggers_of(b)) == 3]
    assert three, "the README's LLM trigger set"
    assert all(says(m, t) for m, t in zip(three[0], LLM_TRIGGERS, strict=True)), three[0]
    # Waking from zero: sizing (with the pool) and the wake.
    wake = [triggers_of(b) for b in blocks if b.get("spec", {}).get("minReplicaCount") == 0]
    assert wake and says(wake[0][0], SIZING) and says(wake[0][1], WAKE), wake
    first_screen = README.split("## Try it")[0]
    assert (
        "`demand`" in README.split("## Install")[0] and "DaemonSet" in first_screen and "NVML" in first_screen
    )


async def test_notes_the_cli_help_and_the_demo_say_it_too() -> None:
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    for trigger in (SIZING, GUARD):
        for key, value in trigger.metadata:
            pattern = rf"{key}: {value}\b" if key == "metric" or key == "demandUnit" else rf'{key}: "{value}"'
            assert re.search(pattern, notes), (key, value)
    assert "metric: pending" in notes
    help_text = build_parser().format_help()
    assert llm_summary() in " ".join(help_text.split()), help_text
    fleet = DemoFleet(seed=7)
    await fleet.start()
    try:
        names = {w.name for w in fleet.inference_workloads}
        metrics = [t.metadata.get("metric") for t in demo_targets(fleet) if t.name in names]
        assert metrics and set(metrics) == {SIZING.metric}, metrics
        assert llm_summary() in banner(fleet, 6000, 8080)
    finally:
        await fleet.stop()


def kustomize(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed")
    out = subprocess.run([kubectl, "kustomize", str(directory)], check=True, capture_output=True, text=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def scaled_object(directory: str) -> dict[str, Any]:
    (found,) = [
        d for d in kustomize(ROOT / "manifests" / "examples" / directory) if d["kind"] == "ScaledObject"
    ]
    return found


def readme_row(what: str) -> str:
    (row,) = [line for line in README.splitlines() if line.startswith(f"| {what} |")]
    return row


def test_the_llm_examples_render_what_the_readme_says() -> None:
    serving = scaled_object("vllm-llm-serving")
    sizing, guard = triggers_of(serving)
    assert says(sizing, SIZING) and says(guard, GUARD)
    row = readme_row("LLM example")
    for metadata in (sizing, guard):
        assert f"`{metadata['metric']}`" in row and metadata["threshold"] in row, row
    assert "kv_cache" not in row and "port 8000" not in row, row
    wake = scaled_object("vllm-wake-from-zero")
    sizing, pending = triggers_of(wake)
    assert says(sizing, SIZING) and says(pending, WAKE)
    # A pool loading its model keeps a replica; KEDA's fallback needs AverageValue on external triggers.
    assert wake["spec"]["fallback"] == {"failureThreshold": 3, "replicas": 1}
    assert {t["metricType"] for t in wake["spec"]["triggers"]} == {"AverageValue"}
    row = readme_row("waking from zero")
    assert all(f"`{m}`" in row for m in (sizing["metric"], pending["metric"])) and "fallback" in row, row


def test_the_chart_examples_install_the_image_the_readme_installs() -> None:
    released = yaml.safe_load((CHART / "values.yaml").read_text())["image"]["repository"]
    assert f"helm install keda-gpu-scaler oci://{released.rsplit('/', 1)[0]}/charts/" in README
    for example in sorted((CHART / "examples").glob("*.yaml")):
        values = yaml.safe_load(example.read_text()) or {}
        assert "repository" not in values.get("image", {}), example.name
        policy = values.get("networkPolicy", {}).get("enabled")
        # The README says what each example's NetworkPolicy governs: traffic into the scaler only.
        if example.name == "vllm-values.yaml":
            assert policy and not values.get("tenantNetworkPolicy", {}).get("enabled"), values
            assert "NetworkPolicy admitting only KEDA to the scaler" in README
