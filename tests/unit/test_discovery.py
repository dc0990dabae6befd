"""Discovery's pure parts: label selectors, exporter selectors, pod rules, ScaledObject and trigger matching."""

from __future__ import annotations

import random
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry, Gauge

from keda_gpu_scaler.collect.wanted import ExporterNode, ExporterPage, WantedSources
from keda_gpu_scaler.config.settings import SettingsError, build_settings, resolve_kubernetes
from keda_gpu_scaler.core.errors import KubeError, NoData
from keda_gpu_scaler.core.selectors import (
    DEFAULT_EXPORTER_SELECTORS,
    SelectorError,
    parse_exporter_selector,
    parse_selector,
)
from keda_gpu_scaler.core.trigger_parse import parse_trigger
from keda_gpu_scaler.kubernetes.api import KubeApi
from keda_gpu_scaler.kubernetes.exporters import ExporterDiscovery
from keda_gpu_scaler.kubernetes.kinds import DISCOVERY_CACHE_SECONDS, ScaleKinds
from keda_gpu_scaler.kubernetes.pods import PodInfo, exporter_url, pod_info
from keda_gpu_scaler.kubernetes.scaledobject import ScaleTarget, metric_type_for, parse_scaled_object
from keda_gpu_scaler.kubernetes.targets import NamespaceIndex, Selection

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
AUTO = {"metric": "demand", "threshold": "auto", "thresholdStart": "12", "podNamePrefix": "chat-"}


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
        # A learned threshold matches its own trigger, not another demand trigger.
        (
            [
                {"type": "external", "metadata": AUTO | {"thresholdStart": "9"}},
                {"type": "external-push", "metricType": "Value", "metadata": AUTO},
            ],
            AUTO,
            "Value",
        ),
        # A latency target tells two demand triggers apart, and matches its own trigger.
        (
            [
                {"type": "external", "metadata": AUTO | {"sloTpotMs": "40"}},
                {"type": "external-push", "metricType": "Value", "metadata": AUTO | {"sloTpotMs": "50"}},
            ],
            AUTO | {"sloTpotMs": "50"},
            "Value",
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


@pytest.mark.parametrize(
    "call",
    [
        # KEDA resolves each `…FromEnv` key from the target's environment and sends the value under that key…
        METADATA | {"thresholdFromEnv": "65", "activationThresholdFromEnv": "5"} | {"threshold": None},
        # …or the call gives the resolved twin itself.
        {"threshold": "65", "activationThreshold": "5", "scalerAddress": "elsewhere:6000"},
        # An empty variable: KEDA leaves the key out, and the default applies on the call's side.
        {"threshold": "65"},
    ],
)
def test_metric_type_with_keys_keda_resolves_from_the_environment(call: dict[str, str | None]) -> None:
    from_env = {"thresholdFromEnv": "GPU_TARGET", "activationThresholdFromEnv": "GPU_ACTIVATION"}
    info = parse_scaled_object(
        _scaled_object(
            {"type": "external", "metricType": "AverageValue", "metadata": METADATA | {"metric": "memory"}},
            {
                "type": "external-push",
                "metricType": "Value",
                "metadata": {"scalerAddress": "x:6000"} | from_env,
            },
        )
    )
    metadata = {k: v for k, v in call.items() if v is not None}
    assert metric_type_for(info, parse_trigger(metadata)) == ("Value", None)
    # Keys not taken from the environment still have to agree.
    assert metric_type_for(info, parse_trigger(metadata | {"gpuAggregation": "max"}))[0] is None


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


# --- incremental target sets and exporter discovery ------------------------------------------------------


def _info(
    name: str, labels: dict[str, str], node: str | None, phase: str, ready: bool, deleting: bool
) -> PodInfo:
    ports = (("http", 8000), (None, 9000))
    ip = "10.0.0.1" if phase == "Running" else None
    return PodInfo("ns", name, labels, node, ip, phase, ready, deleting, ports)


SELECTORS = ["app=a", "app=b,tier=gpu", "tier in (gpu)", "!canary", "app!=a", "app=a,canary"]


def test_target_sets_follow_every_pod_event_as_a_full_rescan_would() -> None:
    """Random pod events, applied one at a time, leave each selection equal to matching every pod again."""
    rng = random.Random(7)
    index = NamespaceIndex("ns")
    pods: dict[str, PodInfo] = {}
    selections = {text: index.acquire(parse_selector(text), text, {}) for text in SELECTORS[:3]}
    for step in range(1500):
        name = f"p{rng.randrange(30)}"
        old = pods.get(name)
        if old is not None and rng.random() < 0.2:
            new = None
            del pods[name]
        else:
            labels = {"app": rng.choice("abc")}
            if rng.random() < 0.5:
                labels["tier"] = rng.choice(["gpu", "cpu"])
            if rng.random() < 0.2:
                labels["canary"] = "true"
            phase = rng.choice(["Pending", "Running", "Running", "Succeeded"])
            node = (
                rng.choice([None, "n1", "n2", "n3"]) if phase == "Pending" else rng.choice(["n1", "n2", "n3"])
            )
            new = _info(name, labels, node, phase, rng.random() < 0.7, rng.random() < 0.1)
            pods[name] = new
        index.on_pod(old, new)
        if step == 500:  # selections that start late begin from the pods as they are
            for text in SELECTORS[3:]:
                selections[text] = index.acquire(
                    parse_selector(text), text, {p.key: p for p in pods.values()}
                )
        if step == 1000:  # one dropped: a pod event no longer touches it
            index.release(parse_selector("tier in (gpu)"), "tier in (gpu)")
            del selections["tier in (gpu)"]
        for text, selection in selections.items():
            selector = parse_selector(text)
            matching = [p for p in pods.values() if selector.matches(p.labels)]
            targets = selection.targets("Value")
            assert targets.pods == {p.name for p in matching if p.counts_as_target}, (step, text)
            assert targets.metric_type == "Value"
            shown = [p for p in matching if p.occupies_node or p.counts_as_target]
            assert set(targets.endpoints) == {p.name for p in shown}
            assert targets.nodes == {p.node for p in matching if p.occupies_node and p.node}, (step, text)


def test_targets_stay_the_same_until_something_changes() -> None:
    index = NamespaceIndex("ns")
    selection = index.acquire(parse_selector("app=a"), "so", {})
    ready = _info("a-0", {"app": "a"}, "n1", "Running", True, False)
    index.on_pod(None, ready)
    first = selection.targets(None)
    assert selection.targets(None) == first and selection.targets(None).endpoints is first.endpoints
    index.on_pod(None, _info("b-0", {"app": "b"}, "n1", "Running", True, False))  # another workload's pod
    assert selection.targets(None).endpoints is first.endpoints, "the snapshot is built once per change"
    index.on_pod(ready, _info("a-0", {"app": "a"}, "n1", "Running", False, False))  # no longer ready
    assert selection.targets(None).pods == frozenset()
    endpoint = selection.targets(None).endpoints["a-0"]
    assert (endpoint.ip, endpoint.ready, dict(endpoint.ports), endpoint.node) == (
        "10.0.0.1",
        False,
        {"http": 8000},
        "n1",
    )


class _Sink:
    """The exporter collector as the registry of wanted sources drives it."""

    def __init__(self, wanted: WantedSources) -> None:
        self.urls: set[str] = set()
        self.removed: list[str] = []
        wanted.handle(ExporterPage, self.add, self.remove)

    def add(self, page: ExporterPage) -> None:
        assert page.url not in self.urls
        self.urls.add(page.url)

    def remove(self, page: ExporterPage) -> None:
        self.urls.remove(page.url)
        self.removed.append(page.url)


def exporter_discovery() -> tuple[ExporterDiscovery, WantedSources, _Sink]:
    exporter = parse_exporter_selector("app=dcgm:9400")
    wanted = WantedSources()
    gauge = Gauge("g", "g", registry=CollectorRegistry())
    return ExporterDiscovery((exporter,), False, gauge, wanted), wanted, _Sink(wanted)


def test_exporters_are_scraped_exactly_on_wanted_nodes() -> None:
    discovery, wanted, sink = exporter_discovery()

    def dcgm(node: str, ip: str | None) -> PodInfo:
        return PodInfo("gpu", f"dcgm-{node}", {"app": "dcgm"}, node, ip, "Running", True, False, ())

    a = dcgm("n1", "10.1.0.1")
    discovery._exporter_pod(0, None, a)
    assert sink.urls == set()  # no target pod on n1 yet
    wanted.want("trigger a", [ExporterNode("n1")])
    wanted.want("trigger b", [ExporterNode("n1")])  # a second trigger on the same node
    assert sink.urls == {"http://10.1.0.1:9400/metrics"}
    moved = dcgm("n1", "10.1.0.2")  # the exporter restarted with another IP
    discovery._exporter_pod(0, a, moved)
    assert sink.urls == {"http://10.1.0.2:9400/metrics"}
    wanted.release("trigger a")
    assert sink.urls == {"http://10.1.0.2:9400/metrics"}
    wanted.release("trigger b")
    assert sink.urls == set()
    wanted.want("trigger a", [ExporterNode("n2")])
    discovery._exporter_pod(0, None, dcgm("n2", "10.1.0.3"))
    assert sink.urls == {"http://10.1.0.3:9400/metrics"}
    assert discovery.check({"n2": 1}) is True
    with pytest.raises(NoData, match="no GPU exporter pod runs"):
        discovery.check({"n9": 1})
    discovery.close()
    assert sink.urls == set()


def test_a_pod_event_touches_only_the_selections_it_can_match(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hundreds of ScaledObjects in a namespace: a pod event updates the one or two whose selector names
    its labels (plus any selector without a key=value requirement), not all of them."""
    index = NamespaceIndex("ns")
    for w in range(300):
        index.acquire(parse_selector(f"app=w-{w},tier=gpu"), w, {})
    index.acquire(parse_selector("tier in (gpu)"), "set-based", {})
    touched: list[str] = []
    original = Selection.update

    def counting(self: Selection, old: PodInfo | None, new: PodInfo | None) -> None:
        touched.append(self.selector.text)
        original(self, old, new)

    monkeypatch.setattr(Selection, "update", counting)
    pod = _info("w-7-0", {"app": "w-7", "tier": "gpu"}, "n1", "Running", True, False)
    index.on_pod(None, pod)
    assert sorted(touched) == ["app=w-7,tier=gpu", "tier in (gpu)"]
    touched.clear()
    relabelled = _info("w-7-0", {"app": "w-8", "tier": "gpu"}, "n1", "Running", True, False)
    index.on_pod(pod, relabelled)  # matched w-7 before, matches w-8 now: both are updated
    assert sorted(touched) == ["app=w-7,tier=gpu", "app=w-8,tier=gpu", "tier in (gpu)"]
    assert index.selections[parse_selector("app=w-8,tier=gpu")].targets(None).pods == {"w-7-0"}
    assert not index.selections[parse_selector("app=w-7,tier=gpu")].targets(None).pods


def test_an_exporter_pod_update_that_keeps_its_url_keeps_its_data() -> None:
    discovery, wanted, sink = exporter_discovery()
    before = PodInfo("gpu", "dcgm-n1", {"app": "dcgm"}, "n1", "10.1.0.1", "Running", True, False, ())
    discovery._exporter_pod(0, None, before)
    wanted.want("trigger", [ExporterNode("n1")])
    relabelled = PodInfo(
        "gpu", "dcgm-n1", {"app": "dcgm", "new": "x"}, "n1", "10.1.0.1", "Running", False, False, ()
    )
    discovery._exporter_pod(0, before, relabelled)  # a readiness flip and a label edit, same node and URL
    assert sink.removed == []  # the source (and its last page) stays


async def test_a_kind_that_gains_its_scale_subresource_is_looked_up_again() -> None:
    # A CRD upgraded to serve /scale becomes usable once the discovery cache has aged, without a restart.
    now, resources = [0.0], [{"kind": "Widget", "name": "widgets"}]

    class Api:
        async def api_resources(self, group: str, version: str) -> dict[str, Any]:
            return {"resources": list(resources)}

    kinds, api = ScaleKinds(lambda: now[0]), cast(KubeApi, Api())
    target = ScaleTarget("example.com/v1", "Widget", "w")
    with pytest.raises(KubeError, match="no /scale subresource"):
        await kinds.plural(api, target)
    resources.append({"name": "widgets/scale"})
    now[0] = DISCOVERY_CACHE_SECONDS / 2
    with pytest.raises(KubeError, match="no /scale subresource"):
        await kinds.plural(api, target)  # still trusted
    now[0] = DISCOVERY_CACHE_SECONDS + 1
    assert await kinds.plural(api, target) == "widgets"


GPU_TRIGGER = {"type": "external", "metadata": {"metric": "utilization", "threshold": "70"}}


@pytest.mark.parametrize(
    ("written", "resolved"),
    [
        # thresholdStart from the environment: the learned target's start is not known from the object.
        (
            {"metric": "demand", "threshold": "auto", "thresholdStartFromEnv": "START"},
            {"metric": "demand", "threshold": "auto", "thresholdStartFromEnv": "10"},
        ),
        # the pool from the environment: a latency target on `requests` is allowed only with one.
        (
            {"metric": "requests", "threshold": "5", "sloTtftSeconds": "1", "inferencePoolFromEnv": "POOL"},
            {"metric": "requests", "threshold": "5", "sloTtftSeconds": "1", "inferencePoolFromEnv": "chat"},
        ),
        # the metric from the environment, beside a latency target (the read of the object raised KeyError).
        (
            {"metricFromEnv": "METRIC", "threshold": "20", "sloTtftSeconds": "1"},
            {"metricFromEnv": "demand", "threshold": "20", "sloTtftSeconds": "1"},
        ),
    ],
)
def test_a_trigger_with_a_key_from_the_environment_that_another_depends_on_is_its_own(
    written: dict[str, str], resolved: dict[str, str]
) -> None:
    # Matched to no trigger, it took the wrong metricType (sum under Value: N times the replicas) and was
    # taken for edited away, its pages released.
    learned = {"type": "external-push", "metricType": "Value", "metadata": written}
    info = parse_scaled_object(
        {"spec": {"scaleTargetRef": {"name": "chat"}, "triggers": [GPU_TRIGGER, learned]}}
    )
    call = parse_trigger(resolved)
    assert [t.matches(call) for t in info.triggers] == [False, True]
    assert metric_type_for(info, call) == ("Value", None)
