"""Every example is what the README says of it: each kustomize example under manifests/examples/ and each
of the chart's example values files is rendered (kubectl kustomize, the real Helm engine), and the README's
words about it are checked against what renders — triggers, thresholds, fallback, image, exporters, and
what the NetworkPolicies admit. NOTES.txt, rendered through Helm, names the recommended triggers."""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_chart import NAMESPACE, RELEASE, kustomize, render, render_files

from keda_gpu_scaler.core.recommended import GUARD, SIZING, WAKE, Recommended
from keda_gpu_scaler.core.selectors import DEFAULT_EXPORTER_SELECTORS

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "keda-gpu-scaler"
EXAMPLE_VALUES = CHART / "examples"
# The README's words are matched across its line breaks; WORDS: the README's and the chart's README's.
README = " ".join((ROOT / "README.md").read_text().split())
WORDS = README + " " + " ".join((CHART / "README.md").read_text().split())


def released_image() -> str:
    """The image the README's first screen installs: the chart's registry and version, as cosign checks it."""
    install = re.search(r"helm install keda-gpu-scaler oci://(\S+)/charts/\S+ --version (\S+)", README)
    assert install, "the README's first screen installs no chart"
    registry, version = install.groups()
    image = f"{registry}/keda-gpu-scaler:{version}"
    assert f"cosign verify {image}" in README, image
    return image


RELEASED_IMAGE = released_image()


def said(trigger: Recommended, kind: str = "external-push") -> str:
    """A recommended trigger as `trigger_words` renders it."""
    metadata = dict(trigger.metadata)
    return trigger_words({"type": kind, "metricType": "AverageValue", "metadata": metadata})


def trigger_words(trigger: dict[str, Any]) -> str:
    if trigger["type"] == "cron":
        return "cron"
    metadata = trigger["metadata"]
    unit = f"/{metadata['demandUnit']}" if "demandUnit" in metadata else ""
    metric_type = trigger.get("metricType", "AverageValue")
    return f"{trigger['type']} {metadata['metric']}{unit} {metadata['threshold']} {metric_type}"


def admits(policy: dict[str, Any]) -> list[str]:
    """What a NetworkPolicy lets in, as `namespace/selected pods: port from namespaces`."""
    labels = policy["spec"]["podSelector"].get("matchLabels", {})
    selected = labels.get("app.kubernetes.io/name", "every pod")
    where = f"{policy['metadata']['namespace']}/{selected}"
    rules = []
    for rule in policy["spec"]["ingress"]:
        peers = sorted(
            {
                p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                for p in rule.get("from", [])
            }
        )
        for port in rule["ports"]:
            rules.append(f"{where}: {port['port']} from {','.join(peers) or 'anywhere'}")
    return rules


def facts(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """What an example renders, in the terms the table below speaks."""
    found: dict[str, Any] = {"kinds": sorted({d["kind"] for d in docs}), "admits": []}
    for doc in docs:
        spec = doc.get("spec", {})
        if doc["kind"] == "ScaledObject":
            found["triggers"] = [trigger_words(t) for t in spec["triggers"]]
            found["types"] = sorted({t["type"] for t in spec["triggers"]})
            found["minReplicaCount"] = spec.get("minReplicaCount", 1)
            found["fallback"] = spec.get("fallback", {}).get("replicas")
        elif doc["kind"] == "Deployment":
            pod = spec["template"]["spec"]
            container = pod["containers"][0]
            env = {e["name"]: e.get("value", "") for e in container.get("env", [])}
            selectors = env.get("KEDA_GPU_SCALER_EXPORTER_SELECTOR")
            found["image"] = container["image"]
            found["server"] = container["image"].rsplit(":", 1)[0]  # what runs, whatever its version
            found["exporters"] = selectors.split(";") if selectors else list(DEFAULT_EXPORTER_SELECTORS)
            found["tolerates"] = sorted(f"{t['key']}:{t['effect']}" for t in pod.get("tolerations", []))
            found["nodeSelector"] = pod.get("nodeSelector", {})
        elif doc["kind"] == "NetworkPolicy":
            found["admits"] += admits(doc)
    return found


def rendered(example: str) -> list[dict[str, Any]]:
    path = ROOT / example
    if path.is_dir():
        return kustomize(path)
    if path.parent == EXAMPLE_VALUES:
        return render(yaml.safe_load(path.read_text()) or {})
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@dataclass(frozen=True)
class Said:
    example: str  # a kustomize directory, a ScaledObject file or a chart values file (repository paths)
    words: tuple[str, ...]  # what the README (or the chart's) says of it, verbatim
    renders: dict[str, Any] = field(default_factory=dict)  # what those words mean, in the terms of `facts`


LLM = "manifests/examples/vllm-llm-serving"
WAKE_EXAMPLE = "manifests/examples/vllm-wake-from-zero"
GPU = ("aks-nvidia-gpu-operator", "doks-amd-mi300x", "ack-shared-gpu")
GPU_WORDS = "a GPU workload and an `external` ScaledObject"
VLLM = "vllm/vllm-openai"
# What every chart example's NetworkPolicy admits: into the scaler only, gRPC from KEDA, /metrics from
# monitoring; no policy in the namespaces the scaler reads (tenantNetworkPolicy is off in each).
SCALER_POLICY = ["keda/keda-gpu-scaler: grpc from keda", "keda/keda-gpu-scaler: http from monitoring"]
# What the chart renders without values, and the exporters the scaler reads by default (the NVIDIA GPU
# Operator's dcgm-exporter, app=nvidia-dcgm-exporter, and the AMD GPU Operator's metrics-exporter among them).
CHART_KINDS, EXPORTERS = facts(render())["kinds"], list(DEFAULT_EXPORTER_SELECTORS)


def chart_example(*kinds: str, exporters: list[str] = EXPORTERS) -> dict[str, Any]:
    """What a chart example renders: the released image, its NetworkPolicy and `kinds` added."""
    added = sorted({*CHART_KINDS, "NetworkPolicy", *kinds})
    return {"image": RELEASED_IMAGE, "admits": SCALER_POLICY, "kinds": added, "exporters": exporters}


CHART_WORDS = (
    "each with a NetworkPolicy into the scaler only (gRPC from KEDA, `/metrics` from namespace `monitoring`)",
)
EXAMPLES = [
    Said(
        LLM,
        (
            "a vLLM Deployment and a ScaledObject with `demand` (sizing, tokens, 15000) and `requests` (guard, 64)",
            "a vLLM Deployment sized on `demand` with a `requests` guard",
        ),
        {"server": VLLM, "triggers": [said(SIZING), said(GUARD)], "minReplicaCount": 1},
    ),
    Said(
        WAKE_EXAMPLE,
        (
            "a vLLM Deployment at `minReplicaCount: 0` and a ScaledObject with `demand`, `pending` (the wake) and "
            "`fallback` 1 replica",
        ),
        # A pool loading its model keeps a replica; KEDA's fallback needs AverageValue on external triggers.
        {"server": VLLM, "triggers": [said(SIZING), said(WAKE)], "minReplicaCount": 0, "fallback": 1},
    ),
    Said(
        f"manifests/examples/{GPU[0]}",
        (
            GPU_WORDS,
            "with a real per-pod target of 70",
            "returns the sum over the Deployment's own ready pods",
        ),
        {"triggers": ["external utilization 70 AverageValue"]},
    ),
    Said(
        f"manifests/examples/{GPU[1]}",
        (
            GPU_WORDS,
            "2 pods at 80 % = 160 → `ceil(160 / 80) = 2` holds; pods tolerate DOKS's `amd.com/gpu:NoSchedule` taint",
        ),
        {
            "triggers": ["external utilization 80 AverageValue"],
            "tolerates": ["amd.com/gpu:NoSchedule"],
            "nodeSelector": {
                "doks.digitalocean.com/gpu-brand": "amd",
                "doks.digitalocean.com/gpu-model": "mi300x",
            },
        },
    ),
    Said(
        f"manifests/examples/{GPU[2]}",
        (
            GPU_WORDS,
            "with `metricType: Value` the scaler picks `mean` itself, so 3 pods at 70 % with threshold 50",
        ),
        {"triggers": ["external utilization 50 Value"]},
    ),
    *(
        Said(
            f"manifests/examples/{gpu}/scaledobject-push.yaml",
            (
                "`scaledobject-push.yaml`: the `external-push` alternative",
                "scale to zero outside a `cron` window",
            ),
            {"types": ["cron", "external-push"], "minReplicaCount": 0},
        )
        for gpu in GPU
    ),
    Said(
        "charts/keda-gpu-scaler/examples/vllm-values.yaml",
        (
            "`vllm-values.yaml` (the vLLM examples)",
            "vLLM sized on `demand` with a `requests` guard (`vllm-values.yaml`",
            *CHART_WORDS,
        ),
        chart_example(),
    ),
    Said(
        "charts/keda-gpu-scaler/examples/aks-values.yaml",
        ("`aks-values.yaml` (NVIDIA GPU Operator)", *CHART_WORDS),
        chart_example(),
    ),
    Said(
        "charts/keda-gpu-scaler/examples/doks-values.yaml",
        ("`doks-values.yaml` (AMD GPU Operator, with a ServiceMonitor and the alerts)", *CHART_WORDS),
        chart_example("ServiceMonitor", "PrometheusRule"),
    ),
    Said(
        "charts/keda-gpu-scaler/examples/ack-values.yaml",
        ("`ack-values.yaml` (adds ACK's exporter with `exporterSelectors.ack.enabled`)", *CHART_WORDS),
        chart_example(exporters=[*EXPORTERS, "k8s-app=ack-prometheus-gpu-exporter"]),
    ),
]


@pytest.mark.parametrize("said", EXAMPLES, ids=lambda s: s.example.split("examples/")[1])
def test_the_readme_says_what_each_example_renders(said: Said) -> None:
    unsaid = [words for words in said.words if words not in WORDS]
    assert not unsaid, f"the README no longer says this of {said.example}: {unsaid}"
    found = facts(rendered(said.example))
    for key, expected in said.renders.items():
        assert found[key] == expected, (said.example, key, found[key])
    # Every metric an example scales on is one the README's words name.
    for trigger in found.get("triggers", []):
        if trigger != "cron" and said.example in (LLM, WAKE_EXAMPLE):
            metric = trigger.split()[1].split("/")[0]
            assert any(f"`{metric}`" in words for words in said.words), (said.example, metric)


def test_every_example_is_in_the_table() -> None:
    covered = {s.example for s in EXAMPLES}
    for directory in sorted((ROOT / "manifests" / "examples").iterdir()):
        assert str(directory.relative_to(ROOT)) in covered, directory.name
    for values in sorted(EXAMPLE_VALUES.glob("*.yaml")):
        assert str(values.relative_to(ROOT)) in covered, values.name


def notes_of(values: dict[str, Any]) -> str:
    (notes,) = [text for path, text in render_files(values).items() if path.endswith("NOTES.txt")]
    return notes


@pytest.mark.parametrize("values", sorted(EXAMPLE_VALUES.glob("*.yaml")), ids=lambda p: p.name)
def test_notes_rendered_name_the_recommended_triggers(values: Path) -> None:
    notes = notes_of(yaml.safe_load(values.read_text()) or {})
    assert f"(image {RELEASED_IMAGE})" in notes
    blocks = re.findall(r"^  triggers:\n(?:    .*\n)+", notes, re.M)
    llm = yaml.safe_load(textwrap.dedent(blocks[0]))["triggers"]
    assert [trigger_words(t) for t in llm] == [said(SIZING), said(GUARD)], llm
    address = f"{RELEASE}.{NAMESPACE}:6000"
    assert {t["metadata"]["scalerAddress"] for t in llm} == {address}
    wake = re.search(r"# wake from zero.*: metric: (\w+), threshold: \"(\d+)\"", notes)
    assert wake and wake.groups() == (WAKE.metric, dict(WAKE.metadata)["threshold"]), notes
