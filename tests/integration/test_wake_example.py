"""The waking-from-zero example: what its comments promise holds in its YAML."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from keda_gpu_scaler.trigger import Metric, parse_trigger

EXAMPLE = Path(__file__).resolve().parents[2] / "manifests" / "examples" / "vllm-wake-from-zero"
# A vLLM pod with warm caches is Ready after 65-85 s: the EPP must hold a request longer than that.
COLD_START_SECONDS = 85


def _seconds(duration: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1}
    parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", duration)
    assert "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


def test_scales_to_zero_and_wakes_on_the_pools_queue() -> None:
    scaled = yaml.safe_load((EXAMPLE / "scaledobject.yaml").read_text())
    assert scaled["spec"]["minReplicaCount"] == 0
    specs = [parse_trigger(t["metadata"]) for t in scaled["spec"]["triggers"]]
    assert [s.metric for s in specs] == [Metric.REQUESTS, Metric.PENDING]
    assert {t["type"] for t in scaled["spec"]["triggers"]} == {"external-push"}
    pool = yaml.safe_load((EXAMPLE / "inferencepool.yaml").read_text())
    assert specs[1].inference_pool == pool["metadata"]["name"]
    assert pool["metadata"]["namespace"] == scaled["metadata"]["namespace"]
    deployment = yaml.safe_load((EXAMPLE / "deployment.yaml").read_text())
    assert pool["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]


def test_the_endpoint_picker_queues_and_holds_requests_past_a_cold_start() -> None:
    config_map = yaml.safe_load((EXAMPLE / "epp-config.yaml").read_text())
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    assert "flowControl" in config["featureGates"]
    assert _seconds(config["flowControl"]["noEndpointRequestTTL"]) > COLD_START_SECONDS
