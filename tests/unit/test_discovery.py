"""Discovery's pure parts: label selectors, exporter selectors, pod rules, ScaledObject and trigger matching."""

from __future__ import annotations

from typing import Any

import pytest

from keda_gpu_scaler.discovery.pods import exporter_url, pod_info
from keda_gpu_scaler.discovery.scaledobject import metric_type_for, parse_scaled_object
from keda_gpu_scaler.discovery.selectors import (
    DEFAULT_EXPORTER_SELECTORS,
    SelectorError,
    parse_exporter_selector,
    parse_selector,
)
from keda_gpu_scaler.settings import SettingsError, build_settings, resolve_kubernetes
from keda_gpu_scaler.trigger import parse_trigger

LABELS = {"app": "vllm", "tier": "gpu", "version": "3", "app.kubernetes.io/name": "dcgm-exporter"}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ("", True),
        ("app=vllm", True),
        ("app==vllm", True),
        ("app=other", False),
        ("app!=other", True),
        ("missing!=x", True),  # a pod without the label satisfies !=
        ("app=vllm,tier=gpu", True),
        ("app=vllm, tier=cpu", False),
        ("tier in (gpu, cpu)", True),
        ("tier in (cpu)", False),
        ("tier notin (cpu)", True),
        ("missing notin (cpu)", True),
        ("app", True),
        ("!app", False),
        ("!missing", True),
        ("version>2", True),
        ("version<3", False),
        ("app.kubernetes.io/name=dcgm-exporter", True),
        ("app=vllm,tier in (gpu),!missing,version>1", True),
        ("app=", False),  # the label equals the empty string
    ],
)
def test_label_selector_matching(selector: str, matches: bool) -> None:
    assert parse_selector(selector).matches(LABELS) is matches


@pytest.mark.parametrize(
    ("selector", "fragment"),
    [
        ("app=vllm,", "empty requirement"),
        ("tier in (gpu", "unbalanced"),
        ("tier in ()", "at least one value"),
        ("app=vl lm", "cannot read"),
        ("-bad=x", "not a valid label key"),
        ("app=-bad-", "not a valid label value"),
        ("version>two", "non-integer"),
    ],
)
def test_bad_label_selectors_are_explained(selector: str, fragment: str) -> None:
    with pytest.raises(SelectorError, match=fragment):
        parse_selector(selector)


@pytest.mark.parametrize(
    ("text", "selector", "port"),
    [
        ("app=nvidia-dcgm-exporter:9400", "app=nvidia-dcgm-exporter", 9400),
        (
            "app.kubernetes.io/name=metrics-exporter,daemonset-name:5000",
            "app.kubernetes.io/name=metrics-exporter,daemonset-name",
            5000,
        ),
        ("app=x:metrics", "app=x", "metrics"),
        ("k8s-app=ack-prometheus-gpu-exporter", "k8s-app=ack-prometheus-gpu-exporter", None),
    ],
)
def test_exporter_selectors(text: str, selector: str, port: int | str | None) -> None:
    parsed = parse_exporter_selector(text)
    assert (str(parsed.selector), parsed.port) == (selector, port)


@pytest.mark.parametrize("text", ["app=x:0", "app=x:70000", "app=x:Bad_Name", ":9400", "app=x:"])
def test_bad_exporter_selectors(text: str) -> None:
    with pytest.raises(SelectorError):
        parse_exporter_selector(text)


def test_default_exporter_selectors_parse() -> None:
    assert [parse_exporter_selector(s).port for s in DEFAULT_EXPORTER_SELECTORS] == [9400, 9400, 5000]


def _pod(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "labels": {"a": "b"}, **status.pop("meta", {})},
        "spec": {
            "nodeName": "node-a",
            "containers": [
                {
                    "name": "c",
                    "ports": [
                        {"containerPort": 9999, "protocol": "UDP"},
                        {"name": "metrics", "containerPort": 9400},
                    ],
                }
            ],
        },
        "status": {
            "phase": "Running",
            "podIP": "10.0.0.7",
            "conditions": [{"type": "Ready", "status": "True"}],
        }
        | status,
    }


def test_pod_rules_follow_the_hpa() -> None:
    assert pod_info(_pod()).counts_as_target
    assert not pod_info(_pod(conditions=[{"type": "Ready", "status": "False"}])).counts_as_target
    assert not pod_info(_pod(phase="Pending")).counts_as_target
    leaving = pod_info(_pod(meta={"deletionTimestamp": "2026-01-01T00:00:00Z"}))
    assert not leaving.counts_as_target and not leaving.occupies_node
    starting = pod_info(_pod(phase="Pending", conditions=[]))
    assert starting.occupies_node  # its node's exporter is scraped before it turns ready
    assert not pod_info(_pod(phase="Succeeded")).occupies_node


def test_exporter_urls() -> None:
    info = pod_info(_pod())
    assert exporter_url(info, parse_exporter_selector("a=b:9400")) == "http://10.0.0.7:9400/metrics"
    assert exporter_url(info, parse_exporter_selector("a=b:metrics")) == "http://10.0.0.7:9400/metrics"
    # Without a port: the first TCP container port (the UDP one is skipped).
    assert exporter_url(info, parse_exporter_selector("a=b")) == "http://10.0.0.7:9400/metrics"
    assert exporter_url(info, parse_exporter_selector("a=b:other")) is None
    ipv6 = pod_info(_pod(podIP="fd00::7"))
    assert exporter_url(ipv6, parse_exporter_selector("a=b:9400")) == "http://[fd00::7]:9400/metrics"
    assert exporter_url(pod_info(_pod(podIP=None)), parse_exporter_selector("a=b:9400")) is None


METADATA = {"threshold": "70", "scalerAddress": "keda-gpu-scaler.keda:6000"}


def _scaled_object(*triggers: dict[str, Any], ref: dict[str, str] | None = None) -> dict[str, Any]:
    return {"spec": {"scaleTargetRef": ref or {"name": "vllm"}, "triggers": list(triggers)}}


def test_scale_target_defaults_are_keda_s() -> None:
    target = parse_scaled_object(_scaled_object()).target
    assert (target.api_version, target.kind, target.name, target.group) == (
        "apps/v1",
        "Deployment",
        "vllm",
        "apps",
    )
    lws = parse_scaled_object(
        _scaled_object(
            ref={"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "name": "x"}
        )
    ).target
    assert (lws.group, lws.version) == ("leaderworkerset.x-k8s.io", "v1")


@pytest.mark.parametrize(
    ("triggers", "call", "expected"),
    [
        # The only external trigger, metricType absent: KEDA's default.
        ([{"type": "external", "metadata": METADATA}], METADATA, "AverageValue"),
        # The matching one among several, after a cpu trigger.
        (
            [
                {"type": "cpu", "metricType": "Utilization", "metadata": {"value": "50"}},
                {
                    "type": "external",
                    "metricType": "AverageValue",
                    "metadata": METADATA | {"metric": "memory"},
                },
                {"type": "external-push", "metricType": "Value", "metadata": METADATA},
            ],
            METADATA,
            "Value",
        ),
        # …FromEnv keys are not compared (KEDA sends them resolved, or drops them).
        (
            [
                {
                    "type": "external",
                    "metricType": "Value",
                    "metadata": METADATA | {"activationThresholdFromEnv": "A"},
                },
                {"type": "external", "metadata": METADATA | {"metric": "memory"}},
            ],
            METADATA,
            "Value",
        ),
        # Two identical triggers with different metricTypes: cannot tell.
        (
            [
                {"type": "external", "metricType": "Value", "metadata": METADATA},
                {"type": "external", "metricType": "AverageValue", "metadata": METADATA},
            ],
            METADATA,
            None,
        ),
        # No match among several: cannot tell.
        (
            [
                {"type": "external", "metadata": METADATA | {"threshold": "50"}},
                {"type": "external", "metadata": METADATA | {"threshold": "60"}},
            ],
            METADATA,
            None,
        ),
    ],
)
def test_metric_type_of_the_matching_trigger(
    triggers: list[dict[str, Any]], call: dict[str, str], expected: str | None
) -> None:
    info = parse_scaled_object(_scaled_object(*triggers))
    metric_type, note = metric_type_for(info, parse_trigger(call))
    assert metric_type == expected
    assert (note is None) == (expected is not None)


def test_settings_flags() -> None:
    settings = build_settings(
        {
            "exporter_selector": ["app=a:9400;app=b:metrics", "app=c"],
            "discovery_interval": "5",
            "kubeconfig": "/tmp/kc",
        }
    )
    assert [str(s) for s in settings.exporter_selectors] == ["app=a:9400", "app=b:metrics", "app=c"]
    assert settings.discovery_interval == 5 and settings.kubeconfig == "/tmp/kc"
    assert len(build_settings({}).exporter_selectors) == len(DEFAULT_EXPORTER_SELECTORS)
    with pytest.raises(SettingsError, match="exporter-selector"):
        build_settings({"exporter_selector": ["app in (x"]})


def test_kubernetes_auto() -> None:
    off = build_settings({})
    assert resolve_kubernetes(off, {}).kubernetes == "off"
    on = resolve_kubernetes(off, {"KUBECONFIG": "/tmp/kc"})
    assert (on.kubernetes, on.kubeconfig) == ("on", "/tmp/kc")
    forced_off = resolve_kubernetes(build_settings({"kubernetes": "off"}), {"KUBECONFIG": "/tmp/kc"})
    assert forced_off.kubernetes == "off"
