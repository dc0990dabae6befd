"""One recommendation everywhere: the README, the CLI help and the demo say the LLM triggers of
keda_gpu_scaler.core.recommended (NOTES.txt and the examples: test_examples.py, as they render)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from keda_gpu_scaler.cli import build_parser
from keda_gpu_scaler.core.recommended import LLM_TRIGGERS, SIZING, WAKE, Recommended, llm_summary
from keda_gpu_scaler.demo.fleet import DemoFleet
from keda_gpu_scaler.demo.runner import banner, demo_targets

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


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


async def test_the_cli_help_and_the_demo_say_it_too() -> None:
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
