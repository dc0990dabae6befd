"""The waking-from-zero example: it sits on llm-d's own router chart, and what its comments promise holds in
its YAML (rendered with kustomize where it is a build)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from test_manifests import find, kustomize

from keda_gpu_scaler.config.settings import build_settings, env_values
from keda_gpu_scaler.core.trigger import Metric
from keda_gpu_scaler.core.trigger_parse import parse_trigger

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
EXAMPLE = MANIFESTS / "examples" / "vllm-wake-from-zero"
# A vLLM pod with warm caches is Ready after 65-85 s: the EPP must hold a request longer than that.
COLD_START_SECONDS = 85
# The release name the install command gives llm-d's router chart: the InferencePool's name.
RELEASE = "chat-pool"
# llm-d-router v0.10's default-plugins.yaml: its scorers and default profile, which the example keeps.
DEFAULT_PROFILE = [
    {"pluginRef": "queue-scorer", "weight": 2},
    {"pluginRef": "kv-cache-utilization-scorer", "weight": 2},
    {"pluginRef": "prefix-cache-scorer", "weight": 3},
]


def _seconds(duration: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1}
    parts = re.findall(r"(\d+(?:\.\d+)?)([hms])", duration)
    assert "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


def _router_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((EXAMPLE / "llm-d-router-values.yaml").read_text())
    return values


def _epp_config() -> dict[str, Any]:
    epp = _router_values()["router"]["epp"]
    config: dict[str, Any] = yaml.safe_load(epp["pluginsCustomConfig"][epp["pluginsConfigFile"]])
    return config


def test_scales_to_zero_and_wakes_on_the_pool_llm_d_creates() -> None:
    docs = kustomize(EXAMPLE)
    scaled = find(docs, "ScaledObject")
    assert scaled["spec"]["minReplicaCount"] == 0
    specs = [parse_trigger(t["metadata"]) for t in scaled["spec"]["triggers"]]
    # demand sizes (the pool's held requests included), pending wakes.
    assert [s.metric for s in specs] == [Metric.DEMAND, Metric.PENDING]
    assert {t["type"] for t in scaled["spec"]["triggers"]} == {"external-push"}
    assert specs[0].inference_pool == specs[1].inference_pool == RELEASE
    assert f"helm install {RELEASE} " in (EXAMPLE / "llm-d-router-values.yaml").read_text()
    deployment = find(docs, "Deployment")
    router = _router_values()["router"]
    assert router["modelServers"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    container_ports = {
        p["containerPort"] for c in deployment["spec"]["template"]["spec"]["containers"] for p in c["ports"]
    }
    assert {p["number"] for p in router["modelServers"]["targetPorts"]} <= container_ports
    assert {d["metadata"]["namespace"] for d in docs if d["kind"] != "Namespace"} == {"llm"}


def test_no_pool_or_epp_configuration_competes_with_llm_ds() -> None:
    kinds = {d["kind"] for d in kustomize(EXAMPLE)}
    assert kinds == {"Namespace", "Deployment", "ScaledObject"}  # no InferencePool, no unmounted ConfigMap
    assert not (EXAMPLE / "inferencepool.yaml").exists() and not (EXAMPLE / "epp-config.yaml").exists()


def test_the_endpoint_picker_queues_and_holds_requests_past_a_cold_start() -> None:
    config = _epp_config()
    assert config["kind"] == "EndpointPickerConfig"
    assert "flowControl" in config["featureGates"]
    assert _seconds(config["flowControl"]["noEndpointRequestTTL"]) > COLD_START_SECONDS
    # llm-d's default scheduling is kept: the file adds flow control, it does not replace the profile.
    (profile,) = config["schedulingProfiles"]
    assert profile == {"name": "default", "plugins": DEFAULT_PROFILE}
    declared = {p["type"] for p in config["plugins"]}
    assert {p["pluginRef"] for p in DEFAULT_PROFILE} <= declared


def test_the_scaler_reads_a_picker_whose_metrics_need_no_token_it_would_refuse() -> None:
    # llm-d's built-in metrics auth reviews tokens for the API server's audience: it refuses the scaler's
    # per-namespace ones (401, the example never woke), and one it accepted would read every namespace's
    # picker. The example serves the picker's metrics without auth; the scaler sends no token there.
    assert _router_values()["router"]["monitoring"]["prometheus"]["auth"]["enabled"] is False
    values = (EXAMPLE / "llm-d-router-values.yaml").read_text()
    assert "--auth-token-audiences=keda-gpu-scaler-epp:llm" in values and "NetworkPolicy" in values
    docs = kustomize(EXAMPLE / "scaler")
    (container,) = find(docs, "Deployment", "keda-gpu-scaler")["spec"]["template"]["spec"]["containers"]
    settings = build_settings(env_values({e["name"]: e["value"] for e in container.get("env", [])}))
    assert settings.kubernetes == "on"
    assert settings.gateway_token_file is None and settings.gateway_token_serviceaccount is None
    assert not settings.gateway_token_plain_http  # the scaler's own token never goes over plain HTTP
