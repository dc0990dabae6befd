"""Kubernetes discovery end to end: the real kubernetes_asyncio client against a loopback API server."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from fake_kube import (
    DAEMONSET,
    DEPLOYMENT,
    LEADER_WORKER_SET,
    POD,
    SCALED_OBJECT,
    FakeKube,
    deployment,
    pod,
    scaled_object,
)
from support import ExporterServer, GpuLine, dcgm_page, eventually, latest_trigger

from keda_gpu_scaler.core.selectors import parse_exporter_selector
from keda_gpu_scaler.core.trigger_parse import parse_trigger
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb

NS = "llm"
EXPORTERS_NS = "gpu-operator"
EXPORTER_LABELS = {"app": "test-dcgm-exporter"}
APP = {"app": "vllm"}
METADATA = {"threshold": "70", "scalerAddress": "keda-gpu-scaler.keda:6000"}
CPU_TRIGGER = {"type": "cpu", "metricType": "Utilization", "metadata": {"value": "60"}}


def external(metadata: dict[str, str] = METADATA, metric_type: str | None = None) -> dict[str, Any]:
    trigger: dict[str, Any] = {"type": "external", "metadata": metadata}
    if metric_type:
        trigger["metricType"] = metric_type
    return trigger


def ref(name: str = "vllm", metadata: dict[str, str] = METADATA) -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name=name, namespace=NS, scalerMetadata=metadata)


@dataclass
class Cluster:
    """The fake API server plus one real loopback exporter per GPU node, whose pages follow the pods."""

    kube: FakeKube
    make_exporter: Callable[..., Awaitable[ExporterServer]]
    exporters: dict[str, ExporterServer] = field(default_factory=dict)
    load: dict[str, tuple[str, float]] = field(default_factory=dict)  # pod → (node, utilization)

    async def gpu_node(self, node: str) -> ExporterServer:
        exporter = await self.make_exporter()
        self.exporters[node] = exporter
        # Every fake pod has IP 127.0.0.1, so each exporter pod declares its own port by name, as the
        # GPU Operator's dcgm-exporter does ("metrics"), and the scaler is told to use that name.
        self.kube.put(
            POD,
            pod(
                f"dcgm-exporter-{node}",
                EXPORTERS_NS,
                EXPORTER_LABELS,
                node,
                ports=[("metrics", exporter.port)],
            ),
        )
        self._pages()
        return exporter

    def run(
        self, name: str, node: str | None, util: float, labels: dict[str, str] = APP, **status: Any
    ) -> None:
        """Create or move a pod; its GPU shows on its node's exporter page (even when not ready)."""
        self.kube.put(POD, pod(name, NS, labels, node, **status))
        self.load.pop(name, None)
        if node is not None:
            self.load[name] = (node, util)
        self._pages()

    def remove(self, name: str) -> None:
        self.kube.delete(POD, NS, name)
        self.load.pop(name, None)
        self._pages()

    def _pages(self) -> None:
        for node, exporter in self.exporters.items():
            lines = [
                GpuLine(NS, pod_name, util, gpu=i)
                for i, (pod_name, (pod_node, util)) in enumerate(sorted(self.load.items()))
                if pod_node == node
            ]
            exporter.page = dcgm_page(lines, host=node)

    def scraped(self, scaler: Any) -> set[str]:
        return {s.source for s in scaler.app.store.sources()}


@pytest.fixture
def cluster(kube: FakeKube, make_exporter: Callable[..., Awaitable[ExporterServer]]) -> Cluster:
    return Cluster(kube, make_exporter)


@pytest.fixture
def kube_scaler(make_scaler, kube: FakeKube, tmp_path: Path):  # type: ignore[no-untyped-def]
    async def make(**overrides: Any) -> Any:
        settings: dict[str, Any] = {
            "kubernetes": "on",
            "kubeconfig": str(kube.kubeconfig(tmp_path)),
            "exporter_selectors": (parse_exporter_selector("app=test-dcgm-exporter:metrics"),),
            "discovery_interval": 0.2,
        }
        return await make_scaler(**(settings | overrides))

    return make


def three_pods_on_two_nodes(cluster: Cluster) -> None:
    cluster.kube.put(DEPLOYMENT, deployment("vllm", NS, APP, replicas=3))
    cluster.kube.put(
        SCALED_OBJECT,
        scaled_object("vllm", NS, {"name": "vllm"}, [CPU_TRIGGER, external()]),
    )
    cluster.run("vllm-0", "node-a", 50)
    cluster.run("vllm-1", "node-a", 60)
    cluster.run("vllm-2", "node-b", 70)
    # Another workload on a third GPU node, and pods of this namespace that are not the target's.
    cluster.run("trainer-0", "node-c", 99, labels={"app": "trainer"})


async def value(scaler: Any, name: str = "vllm", metadata: dict[str, str] = METADATA) -> float:
    request = pb.GetMetricsRequest(scaledObjectRef=ref(name, metadata), metricName="gpu-utilization")
    response = await scaler.stub.GetMetrics(request)
    assert len(response.metricValues) == 1
    result: float = response.metricValues[0].metricValueFloat
    return result


async def explain(scaler: Any, name: str = "vllm") -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{scaler.http}/explain", params={"namespace": NS, "name": name}) as response,
    ):
        return latest_trigger(json.loads(await response.text()))


async def unavailable(scaler: Any, *needles: str, name: str = "vllm") -> str:
    """Assert that GetMetrics and IsActive both answer UNAVAILABLE (never a value) naming each needle."""
    details = ""
    for call in (
        scaler.stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=ref(name), metricName="gpu-utilization")),
        scaler.stub.IsActive(ref(name)),
    ):
        try:
            await call
        except grpc.aio.AioRpcError as error:
            assert error.code() is grpc.StatusCode.UNAVAILABLE, error
            details = error.details() or ""
            for needle in needles:
                assert needle in details, details
        else:
            raise AssertionError("answered with a value")
    return details


async def test_three_pods_on_two_nodes_scrape_exactly_their_exporters(cluster: Cluster, kube_scaler) -> None:  # type: ignore[no-untyped-def]
    a = await cluster.gpu_node("node-a")
    b = await cluster.gpu_node("node-b")
    c = await cluster.gpu_node("node-c")
    three_pods_on_two_nodes(cluster)
    scaler = await kube_scaler()
    assert (await scaler.stub.GetMetricSpec(ref())).metricSpecs[0].targetSizeFloat == 70

    async def summed() -> None:
        # AverageValue (KEDA's default, and the trigger says nothing): the sum over the target's pods.
        assert await value(scaler) == 180

    await eventually(summed)
    assert cluster.scraped(scaler) == {a.url, b.url}
    assert c.requests == 0
    explanation = await explain(scaler)
    assert [p["pod"] for p in explanation["pods"]] == ["vllm-0", "vllm-1", "vllm-2"]
    assert explanation["aggregation"] == "sum"
    assert explanation["discovery"] == {
        "targetPods": ["vllm-0", "vllm-1", "vllm-2"],
        "metricType": "AverageValue",
    }
    assert explanation["hpa"]["desiredReplicasAverageValue"] == 3
    assert (await scaler.stub.IsActive(ref())).result is True


async def test_pods_added_deleted_and_rescheduled_are_followed(cluster: Cluster, kube_scaler) -> None:  # type: ignore[no-untyped-def]
    a = await cluster.gpu_node("node-a")
    b = await cluster.gpu_node("node-b")
    c = await cluster.gpu_node("node-c")
    three_pods_on_two_nodes(cluster)
    scaler = await kube_scaler()

    async def at(expected: float, exporters: set[str]) -> None:
        assert await value(scaler) == expected
        assert cluster.scraped(scaler) == exporters

    await eventually(lambda: at(180, {a.url, b.url}))
    cluster.run("vllm-3", "node-c", 40)  # scaled up onto the third node
    await eventually(lambda: at(220, {a.url, b.url, c.url}))
    cluster.remove("vllm-2")  # the only target pod on node-b goes
    await eventually(lambda: at(150, {a.url, c.url}))
    cluster.remove("vllm-1")  # rescheduled: same name, another node, another load
    cluster.run("vllm-1", "node-b", 20)
    await eventually(lambda: at(110, {a.url, b.url, c.url}))


async def test_pending_and_not_ready_pods_are_starting_and_terminating_pods_do_not_count(  # type: ignore[no-untyped-def]
    cluster: Cluster, kube_scaler
) -> None:
    await cluster.gpu_node("node-a")
    three_pods_on_two_nodes(cluster)
    cluster.kube.delete(POD, NS, "vllm-2")  # keep node-a only
    cluster.run("vllm-starting", "node-a", 90, ready=False)
    cluster.run("vllm-leaving", "node-a", 90, deleting=True)
    cluster.run("vllm-pending", None, 0, phase="Pending", ready=False)
    scaler = await kube_scaler()

    async def starting_count_as_the_target() -> None:
        # SPEC §4: u = 110 / (2 × 70) ≤ 1, so S + U × T = 110 + 2 × 70 (a starting pod never scales down);
        # their GPUs' values never count, and the terminating pod is not counted at all.
        assert await value(scaler) == 110 + 2 * 70
        explanation = await explain(scaler)
        assert [p["pod"] for p in explanation["pods"]] == ["vllm-0", "vllm-1"]
        assert explanation["missingPods"] == []
        assert explanation["startingPods"] == ["vllm-pending", "vllm-starting"]
        assert explanation["rule"].startswith("no scale-up")

    await eventually(starting_count_as_the_target)


async def test_a_target_whose_pods_all_load_their_model_is_unavailable_never_zero(  # type: ignore[no-untyped-def]
    cluster: Cluster, kube_scaler
) -> None:
    await cluster.gpu_node("node-a")
    cluster.kube.put(DEPLOYMENT, deployment("vllm", NS, APP, replicas=2))
    cluster.kube.put(SCALED_OBJECT, scaled_object("vllm", NS, {"name": "vllm"}, [external()]))
    cluster.run("vllm-0", "node-a", 0, ready=False)  # Running, loading weights: not Ready for minutes
    cluster.run("vllm-1", None, 0, phase="Pending", ready=False)
    scaler = await kube_scaler()

    async def unavailable() -> None:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await scaler.stub.IsActive(ref())
        assert raised.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "no target pod is Ready: 2 starting" in (raised.value.details() or "")

    await eventually(unavailable)
    cluster.run("vllm-0", "node-a", 0)  # loaded and Ready, idle: now an answer (0 + 1 starting × 70)
    await eventually(lambda: _equals(value(scaler), 70))
    assert (await scaler.stub.IsActive(ref())).result is False


async def test_target_pod_without_fresh_data_is_missing(cluster: Cluster, kube_scaler) -> None:  # type: ignore[no-untyped-def]
    await cluster.gpu_node("node-a")
    b = await cluster.gpu_node("node-b")
    three_pods_on_two_nodes(cluster)
    cluster.run("vllm-2", "node-b", 90)  # not the threshold (70), so the value tells which one is used
    scaler = await kube_scaler()
    await eventually(lambda: _equals(value(scaler), 200))
    b.status = 503

    async def filled() -> None:
        # vllm-2 is known from Kubernetes but its exporter fails: it counts as the threshold, never 0.
        assert await value(scaler) == 50 + 60 + 70
        assert (await explain(scaler))["missingPods"] == ["vllm-2"]

    await eventually(filled)


async def _equals(coroutine: Awaitable[float], expected: float) -> None:
    assert await coroutine == expected


async def test_scaled_to_zero_is_zero_and_inactive(cluster: Cluster, kube_scaler) -> None:  # type: ignore[no-untyped-def]
    cluster.kube.put(DEPLOYMENT, deployment("vllm", NS, APP, replicas=0))
    cluster.kube.put(SCALED_OBJECT, scaled_object("vllm", NS, {"name": "vllm"}, [external()]))
    scaler = await kube_scaler()
    await eventually(lambda: _equals(value(scaler), 0))
    assert (await scaler.stub.IsActive(ref())).result is False


@pytest.mark.parametrize(
    ("metric_type", "metadata", "expected", "aggregation"),
    [
        (None, METADATA, 180, "sum"),
        ("AverageValue", METADATA, 180, "sum"),
        ("Value", METADATA, 60, "mean"),
        ("Value", METADATA | {"aggregation": "max"}, 70, "max"),
    ],
)
async def test_metric_type_selects_the_aggregation(  # type: ignore[no-untyped-def]
    cluster: Cluster, kube_scaler, metric_type, metadata, expected, aggregation
) -> None:
    await cluster.gpu_node("node-a")
    await cluster.gpu_node("node-b")
    three_pods_on_two_nodes(cluster)
    # A second external trigger with other metadata must not be taken for this call's.
    other = external(
        {"threshold": "80", "metric": "memory"}, "AverageValue" if metric_type == "Value" else "Value"
    )
    cluster.kube.put(
        SCALED_OBJECT,
        scaled_object("vllm", NS, {"name": "vllm"}, [CPU_TRIGGER, other, external(metadata, metric_type)]),
    )
    scaler = await kube_scaler()

    async def check() -> None:
        assert await value(scaler, metadata=metadata) == expected
        assert (await explain(scaler))["aggregation"] == aggregation

    await eventually(check)


async def test_aggregation_contradicting_metric_type_is_noted(cluster: Cluster, kube_scaler) -> None:  # type: ignore[no-untyped-def]
    await cluster.gpu_node("node-a")
    await cluster.gpu_node("node-b")
    three_pods_on_two_nodes(cluster)
    metadata = METADATA | {"aggregation": "mean"}
    cluster.kube.put(SCALED_OBJECT, scaled_object("vllm", NS, {"name": "vllm"}, [external(metadata)]))
    scaler = await kube_scaler()

    async def noted() -> None:
        assert await value(scaler, metadata=metadata) == 60  # as asked, but wrong for AverageValue
        notes = (await explain(scaler)).get("notes", [])
        assert any("contradicts metricType=AverageValue" in n for n in notes), notes

    await eventually(noted)
    assert scaler.app.telemetry.aggregation_mismatches._value.get() >= 1


async def test_api_server_down_is_unavailable_never_zero_then_recovers(
    cluster: Cluster, kube: FakeKube, kube_scaler
) -> None:  # type: ignore[no-untyped-def]
    await cluster.gpu_node("node-a")
    await cluster.gpu_node("node-b")
    three_pods_on_two_nodes(cluster)
    scaler = await kube_scaler()
    await eventually(lambda: _equals(value(scaler), 180))
    port = kube.port
    await kube.stop()
    # The exporters still answer; without the API server the scaler cannot know the target's pods.
    await eventually(lambda: unavailable(scaler, "unreachable"))
    await kube.start(port)
    await eventually(lambda: _equals(value(scaler), 180))


@pytest.mark.parametrize(
    ("verb", "resource", "namespace", "needle"),
    [
        ("list", "pods", NS, "list pods in namespace 'llm'"),
        ("watch", "pods", NS, "watch pods in namespace 'llm'"),
        ("get", "scaledobjects.keda.sh", NS, "get scaledobjects.keda.sh in namespace 'llm'"),
        ("get", "deployments/scale.apps", NS, "get deployments/scale.apps in namespace 'llm'"),
        ("list", "pods", None, "list pods cluster-wide"),
    ],
)
async def test_rbac_denied_names_the_missing_permission(  # type: ignore[no-untyped-def]
    cluster: Cluster, kube: FakeKube, kube_scaler, verb, resource, namespace, needle
) -> None:
    await cluster.gpu_node("node-a")
    await cluster.gpu_node("node-b")
    three_pods_on_two_nodes(cluster)
    kube.deny(verb, resource, namespace)
    scaler = await kube_scaler()
    details = await eventually(lambda: unavailable(scaler, needle, "RBAC"))
    assert "verbs: [" in details  # says which rule to add
    kube.allow_all()
    await eventually(lambda: _equals(value(scaler), 180))


async def test_watch_410_gone_relists_and_recovers(cluster: Cluster, kube: FakeKube, kube_scaler) -> None:  # type: ignore[no-untyped-def]
    await cluster.gpu_node("node-a")
    await cluster.gpu_node("node-b")
    three_pods_on_two_nodes(cluster)
    scaler = await kube_scaler()
    await eventually(lambda: _equals(value(scaler), 180))
    lists = kube.count(f"/api/v1/namespaces/{NS}/pods", watch=False)
    # A change the watch never delivers, then the history is compacted and the watch ends: resuming
    # from the last resourceVersion seen gets 410 Gone, and only a new list shows the change.
    kube.put(POD, pod("vllm-2", NS, APP, "node-b", deleting=True), notify=False)
    kube.compact()
    kube.end_watches()

    async def relisted() -> None:
        assert await value(scaler) == 110
        assert kube.count(f"/api/v1/namespaces/{NS}/pods", watch=False) > lists

    await eventually(relisted)
    restarts = scaler.app.discovery.watch_restarts.labels("gone")._value.get()
    assert restarts >= 1


async def test_a_watch_410_gone_right_after_every_list_backs_off(
    cluster: Cluster, kube: FakeKube, kube_scaler
) -> None:  # type: ignore[no-untyped-def]
    await cluster.gpu_node("node-a")
    await cluster.gpu_node("node-b")
    three_pods_on_two_nodes(cluster)
    scaler = await kube_scaler()
    await eventually(lambda: _equals(value(scaler), 180))
    path = f"/api/v1/namespaces/{NS}/pods"
    # An API server whose watch cache is behind every resourceVersion a list answers (a replica just
    # restarted behind the load balancer): every watch, even from a fresh list, gets 410 Gone.
    kube.oldest_revision = 10**12
    lists = kube.count(path, watch=False)
    kube.end_watches()
    await asyncio.sleep(2.0)  # a rate: only letting time pass shows it
    # Backing off from 0.8 s (as client-go does) lists about 3 times in 2 s; it used to list over a
    # thousand times. The values stay those of the last list meanwhile.
    assert kube.count(path, watch=False) - lists < 20
    assert await value(scaler) == 180


async def test_a_healthy_watch_that_drops_reconnects_promptly_however_often_it_happened(  # type: ignore[no-untyped-def]
    cluster: Cluster, kube: FakeKube, kube_scaler
) -> None:
    await cluster.gpu_node("node-a")
    await cluster.gpu_node("node-b")
    three_pods_on_two_nodes(cluster)
    scaler = await kube_scaler()
    await eventually(lambda: _equals(value(scaler), 180))
    path = f"/api/v1/namespaces/{NS}/pods"
    loop = asyncio.get_running_loop()
    outages: list[float] = []

    async def watching() -> None:
        assert any(w.request is not None and w.request.path == path for w in kube.watchers)

    for _ in range(6):
        # The watch is open and healthy (a bookmark read) before each drop, a load balancer's idle cut.
        await eventually(watching, timeout=60)
        kube.bookmark()
        await asyncio.sleep(0.5)
        watches = kube.count(path, watch=True)
        kube.drop_watches()
        dropped = loop.time()

        async def rewatched(watches: int = watches) -> None:
            assert kube.count(path, watch=True) > watches
            assert await value(scaler) == 180

        await eventually(rewatched, timeout=60)
        outages.append(round(loop.time() - dropped, 1))
    # Each drop is a first failure (a 0.2 s wait); counted as failures in a row, the 5th and 6th drops
    # waited 3.2 and 6.4 s, with the namespace's triggers UNAVAILABLE all the while.
    assert max(outages) < 3.0, f"seconds from each drop to an answer again: {outages}"


async def test_bookmarks_keep_the_watch_resumable(cluster: Cluster, kube: FakeKube, kube_scaler) -> None:  # type: ignore[no-untyped-def]
    await cluster.gpu_node("node-a")
    await cluster.gpu_node("node-b")
    three_pods_on_two_nodes(cluster)
    scaler = await kube_scaler()
    await eventually(lambda: _equals(value(scaler), 180))
    path = f"/api/v1/namespaces/{NS}/pods"

    async def watching() -> None:
        # The namespace's pod and ScaledObject watches and the exporter pods' watch are open.
        assert len(kube.watchers) == 3

    await eventually(watching)
    lists, watches = kube.count(path, watch=False), kube.count(path, watch=True)
    # Changes elsewhere move the resourceVersion on without any event for these watches; the bookmark
    # tells them, so after compaction they resume where the bookmark was: no 410, no relist.
    for i in range(3):
        kube.put(POD, pod(f"other-{i}", "elsewhere", {"app": "other"}, "node-z"))
    kube.bookmark()
    bookmarked = kube.revision
    kube.compact()
    kube.end_watches()  # queued after the bookmark, so each watch reads the bookmark first

    async def resumed() -> None:
        assert kube.count(path, watch=True) > watches
        last = [q for p, q in kube.requests if p == path and "watch=true" in q.lower()][-1]
        assert f"resourceVersion={bookmarked}" in last
        assert len(kube.watchers) == 3

    await eventually(resumed)
    assert kube.count(path, watch=False) == lists
    assert scaler.app.discovery.watch_restarts.labels("gone")._value.get() == 0
    assert await value(scaler) == 180


async def test_any_kind_with_a_scale_subresource(cluster: Cluster, kube: FakeKube, kube_scaler) -> None:  # type: ignore[no-untyped-def]
    await cluster.gpu_node("node-a")
    await cluster.gpu_node("node-b")
    three_pods_on_two_nodes(cluster)
    leaders = {"leaderworkerset.sigs.k8s.io/name": "vllm", "leaderworkerset.sigs.k8s.io/worker-index": "0"}
    kube.put(
        LEADER_WORKER_SET,
        {
            "metadata": {"name": "vllm-lws", "namespace": NS},
            "spec": {"replicas": 1},
            "status": {"hpaPodSelector": ",".join(f"{k}={v}" for k, v in leaders.items())},
        },
    )
    cluster.run("vllm-lws-0", "node-b", 30, labels=leaders)
    target = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "name": "vllm-lws"}
    kube.put(SCALED_OBJECT, scaled_object("lws", NS, target, [external()]))
    scaler = await kube_scaler()
    await eventually(lambda: _equals(value(scaler, "lws"), 30))
    # A kind without /scale: KEDA cannot scale it either, and the message says so.
    kube.put(DAEMONSET, {"metadata": {"name": "agent", "namespace": NS}, "spec": {}})
    no_scale = {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent"}
    kube.put(SCALED_OBJECT, scaled_object("agent", NS, no_scale, [external()]))
    await eventually(lambda: unavailable(scaler, "no /scale subresource", name="agent"))


async def test_pod_selector_overrides_the_target_selector(cluster: Cluster, kube_scaler) -> None:  # type: ignore[no-untyped-def]
    await cluster.gpu_node("node-a")
    c = await cluster.gpu_node("node-c")
    three_pods_on_two_nodes(cluster)
    metadata = METADATA | {"podSelector": "app=trainer"}
    cluster.kube.put(SCALED_OBJECT, scaled_object("vllm", NS, {"name": "vllm"}, [external(metadata)]))
    scaler = await kube_scaler()
    await eventually(lambda: _equals(value(scaler, metadata=metadata), 99))
    assert c.url in cluster.scraped(scaler)


async def test_a_pod_selector_selecting_no_pod_while_the_target_has_replicas_is_unavailable(  # type: ignore[no-untyped-def]
    cluster: Cluster, kube_scaler
) -> None:
    # A typo in podSelector picks no pod: 0 would read as scaled to zero while the target runs 3.
    await cluster.gpu_node("node-a")
    await cluster.gpu_node("node-b")
    three_pods_on_two_nodes(cluster)
    metadata = METADATA | {"podSelector": "app=vlm"}
    cluster.kube.put(SCALED_OBJECT, scaled_object("vllm", NS, {"name": "vllm"}, [external(metadata)]))
    scaler = await kube_scaler()

    async def refused() -> None:
        try:
            answered = await value(scaler, metadata=metadata)
        except grpc.aio.AioRpcError as error:
            details = error.details() or ""
            assert error.code() is grpc.StatusCode.UNAVAILABLE, details
            assert "podSelector 'app=vlm' selects no pod" in details and "3 replicas" in details, details
        else:
            raise AssertionError(f"answered {answered}")

    await eventually(refused)


async def test_pod_name_prefix_is_rejected_with_kubernetes_on(cluster: Cluster, kube_scaler) -> None:  # type: ignore[no-untyped-def]
    scaler = await kube_scaler()
    metadata = METADATA | {"podNamePrefix": "vllm-"}
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await scaler.stub.GetMetricSpec(ref(metadata=metadata))
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "podNamePrefix" in (raised.value.details() or "")
    assert "--kubernetes off" in (raised.value.details() or "")


async def test_missing_scaled_object_and_target_are_unavailable(
    cluster: Cluster, kube: FakeKube, kube_scaler
) -> None:  # type: ignore[no-untyped-def]
    scaler = await kube_scaler()
    await eventually(lambda: unavailable(scaler, "ScaledObject llm/vllm", "not found"))
    kube.put(SCALED_OBJECT, scaled_object("vllm", NS, {"name": "vllm"}, [external()]))
    await eventually(lambda: unavailable(scaler, "Deployment vllm", "not found"))


async def test_target_node_without_exporter_is_unavailable(cluster: Cluster, kube_scaler) -> None:  # type: ignore[no-untyped-def]
    await cluster.gpu_node("node-a")
    cluster.kube.put(DEPLOYMENT, deployment("vllm", NS, APP))
    cluster.kube.put(SCALED_OBJECT, scaled_object("vllm", NS, {"name": "vllm"}, [external()]))
    cluster.run("vllm-0", "node-x", 50)  # a node where no exporter pod runs
    scaler = await kube_scaler()
    await eventually(
        lambda: unavailable(scaler, "no GPU exporter pod runs", "node-x", "app=test-dcgm-exporter")
    )


async def test_a_pod_object_discovery_cannot_read_is_unavailable_not_a_frozen_cache(
    cluster: Cluster, kube: FakeKube, kube_scaler
) -> None:  # type: ignore[no-untyped-def]
    await cluster.gpu_node("node-a")
    await cluster.gpu_node("node-b")
    three_pods_on_two_nodes(cluster)
    scaler = await kube_scaler()
    await eventually(lambda: _equals(value(scaler), 180))
    broken = pod("vllm-9", NS, APP, "node-a")
    broken["status"]["conditions"] = ["Ready"]  # not an object: the watcher cannot read this pod
    kube.put(POD, broken)
    await eventually(lambda: unavailable(scaler, "unexpected error watching"))
    kube.delete(POD, NS, "vllm-9")
    await eventually(lambda: _equals(value(scaler), 180))


async def test_calls_about_objects_that_are_not_there_open_no_pod_watch(
    cluster: Cluster, kube: FakeKube, kube_scaler
) -> None:  # type: ignore[no-untyped-def]
    """Any caller can name any namespace: only a ScaledObject that exists, with an external trigger, gets
    its namespace's pods listed and watched."""
    await cluster.gpu_node("node-a")
    await cluster.gpu_node("node-b")
    three_pods_on_two_nodes(cluster)
    kube.put(SCALED_OBJECT, scaled_object("cpu-only", "other", {"name": "web"}, [CPU_TRIGGER]))
    scaler = await kube_scaler()
    names = [(f"tenant-{i}", "ghost") for i in range(20)] + [("other", "cpu-only")]

    said: dict[str, str] = {}

    async def refused() -> None:
        for namespace, name in names:
            request = pb.GetMetricsRequest(
                scaledObjectRef=pb.ScaledObjectRef(name=name, namespace=namespace, scalerMetadata=METADATA),
                metricName="gpu-utilization",
            )
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await scaler.stub.GetMetrics(request)
            assert raised.value.code() is grpc.StatusCode.UNAVAILABLE
            said[namespace] = raised.value.details() or ""
            assert "first look-up" not in said[namespace]

    await eventually(refused)
    await eventually(lambda: _equals(value(scaler), 180))  # the real one is served
    for namespace, _ in names:
        assert kube.count(f"/api/v1/namespaces/{namespace}/pods") == 0, namespace
    # The real ScaledObject's namespace: its pods and its ScaledObjects; the exporter pods: nothing else.
    assert sorted((w.kind.plural, w.namespace or "", w.selector) for w in kube.watchers) == [
        ("pods", "", "app=test-dcgm-exporter"),
        ("pods", NS, ""),
        ("scaledobjects", NS, ""),
    ]
    assert "not found" in said["tenant-0"]
    assert "no trigger of type external" in said["other"]


async def test_forget_drops_the_watches_and_exporters_then_a_call_follows_again(
    cluster: Cluster, kube: FakeKube, kube_scaler
) -> None:  # type: ignore[no-untyped-def]
    a = await cluster.gpu_node("node-a")
    b = await cluster.gpu_node("node-b")
    three_pods_on_two_nodes(cluster)
    scaler = await kube_scaler()
    await eventually(lambda: _equals(value(scaler), 180))
    discovery = scaler.app.discovery
    assert set(discovery._exporters.discovered) == {a.url, b.url}
    discovery.forget(NS, "vllm")

    async def dropped() -> None:
        # The fake server notices a closed watch when it next writes to it.
        kube.bookmark()
        await asyncio.sleep(0.05)
        assert kube.watchers == []
        assert dict(discovery._exporters.discovered) == {}
        assert discovery.tracked_scaled_objects._value.get() == 0

    await eventually(dropped)
    await eventually(lambda: _equals(value(scaler), 180))
    assert set(discovery._exporters.discovered) == {a.url, b.url}


async def test_targets_carry_each_pod_s_address_readiness_and_ports(cluster: Cluster, kube_scaler) -> None:  # type: ignore[no-untyped-def]
    await cluster.gpu_node("node-a")
    cluster.kube.put(DEPLOYMENT, deployment("vllm", NS, APP))
    cluster.kube.put(SCALED_OBJECT, scaled_object("vllm", NS, {"name": "vllm"}, [external()]))
    cluster.run("vllm-0", "node-a", 50, ports=[("http", 8000), ("metrics", 8001)])
    cluster.run("vllm-1", "node-a", 60, ready=False, ports=[("http", 8000)])
    scaler = await kube_scaler()
    await eventually(lambda: _equals(value(scaler), 50 + 70))  # vllm-1 is starting: it counts as the target
    targets = scaler.app.discovery.resolve(NS, "vllm", parse_trigger(METADATA))
    assert targets.pods == {"vllm-0"}
    ready, starting = targets.endpoints["vllm-0"], targets.endpoints["vllm-1"]
    assert (ready.ip, ready.ready, dict(ready.ports)) == ("127.0.0.1", True, {"http": 8000, "metrics": 8001})
    assert (starting.ready, dict(starting.ports)) == (False, {"http": 8000})


async def test_inference_metrics_read_each_ready_target_pods_own_page(  # type: ignore[no-untyped-def]
    cluster: Cluster, kube_scaler, make_exporter
) -> None:
    from keda_gpu_scaler.demo.engines import EngineLoad, vllm_page

    metadata = {"metric": "requests", "threshold": "8", "scalerAddress": "keda-gpu-scaler.keda:6000"}
    servers = [await make_exporter(vllm_page("llama", [EngineLoad(5 + i, i, 0.1)])) for i in range(3)]
    cluster.kube.put(DEPLOYMENT, deployment("chat", NS, {"app": "chat"}, replicas=2))
    cluster.kube.put(SCALED_OBJECT, scaled_object("chat", NS, {"name": "chat"}, [external(metadata)]))
    # Every fake pod has IP 127.0.0.1: each declares its own server's port, named as vLLM charts do.
    for index in range(2):
        cluster.kube.put(
            POD, pod(f"chat-{index}", NS, {"app": "chat"}, "node-a", ports=[("http", servers[index].port)])
        )
    # Not ready yet: not a target and its page is not read; a starting pod (SPEC §4: counts as the target).
    cluster.kube.put(
        POD, pod("chat-2", NS, {"app": "chat"}, "node-a", ready=False, ports=[("http", servers[2].port)])
    )
    scaler = await kube_scaler()
    request = pb.GetMetricsRequest(
        scaledObjectRef=pb.ScaledObjectRef(name="chat", namespace=NS, scalerMetadata=metadata),
        metricName="inference-requests",
    )

    async def total(expected: float) -> None:
        response = await scaler.stub.GetMetrics(request)
        assert response.metricValues[0].metricValueFloat == expected

    await eventually(lambda: total(5 + 7 + 8))
    scraped = cluster.scraped(scaler)
    assert servers[0].url in scraped and servers[1].url in scraped and servers[2].url not in scraped
    # A rollout step: chat-2 becomes ready, chat-0 goes away; its page is no longer scraped.
    cluster.kube.put(POD, pod("chat-2", NS, {"app": "chat"}, "node-a", ports=[("http", servers[2].port)]))
    cluster.kube.delete(POD, NS, "chat-0")
    await eventually(lambda: total(7 + 9))

    async def released() -> None:
        scaler.app.registry.follow(NS, "chat", parse_trigger(metadata))
        assert servers[0].url not in cluster.scraped(scaler)

    await eventually(released)


async def test_the_api_client_reads_the_proxy_environment_once_not_per_request(
    kube: FakeKube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proxy variables are honoured as kubectl does (NO_PROXY too), read when connecting; requests
    themselves look nothing up (aiohttp would, in a worker thread, on every call)."""
    from keda_gpu_scaler.kubernetes.api import KubeApi, KubeError, connect

    kubeconfig = str(kube.kubeconfig(tmp_path))
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    api_client = await connect(kubeconfig)
    try:
        assert api_client.rest_client.pool_manager.trust_env is False
        assert api_client.configuration.proxy is None
        with pytest.raises(KubeError) as answered:  # a request still goes through: the API server's 404
            await KubeApi(api_client).scaled_object("ml", "missing")
        assert answered.value.status == 404
    finally:
        await api_client.close()
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    api_client = await connect(kubeconfig)
    assert api_client.configuration.proxy == "http://proxy.example:3128"
    await api_client.close()
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    api_client = await connect(kubeconfig)
    assert api_client.configuration.proxy is None
    await api_client.close()


async def test_api_errors_on_the_scaled_object_and_its_scale_keep_the_last_ones_read_in_use(  # type: ignore[no-untyped-def]
    cluster: Cluster, kube: FakeKube, kube_scaler
) -> None:
    await cluster.gpu_node("node-a")
    await cluster.gpu_node("node-b")
    three_pods_on_two_nodes(cluster)
    scaler = await kube_scaler()
    await eventually(lambda: _equals(value(scaler), 180))
    objects = f"/apis/keda.sh/v1alpha1/namespaces/{NS}/scaledobjects"
    scale = f"/apis/apps/v1/namespaces/{NS}/deployments/vllm/scale"
    # The API server refuses for a while (an overload, an RBAC roll-out): the ScaledObject watch breaks
    # and cannot list again, and the /scale re-reads fail.
    for verb in ("get", "list", "watch"):
        kube.deny(verb, "scaledobjects.keda.sh", NS)
    kube.deny("get", "deployments/scale.apps", NS)
    kube.end_watches()
    reads_from, scales_from = kube.count(objects), kube.count(scale)

    async def refused_twice_yet_answered() -> None:
        assert kube.count(objects) >= reads_from + 2
        assert kube.count(scale) >= scales_from + 2
        assert await value(scaler) == 180

    await eventually(refused_twice_yet_answered)
    kube.allow_all()
    await eventually(lambda: _equals(value(scaler), 180))


async def test_an_edit_of_the_scaled_object_is_seen_through_its_watch_without_a_re_read(  # type: ignore[no-untyped-def]
    cluster: Cluster, kube: FakeKube, kube_scaler
) -> None:
    await cluster.gpu_node("node-a")
    await cluster.gpu_node("node-b")
    three_pods_on_two_nodes(cluster)
    # Re-reads far apart: only the watch can bring the edit in time.
    scaler = await kube_scaler(discovery_interval=3600)
    await eventually(lambda: _equals(value(scaler), 180))
    gets = kube.count(f"/apis/keda.sh/v1alpha1/namespaces/{NS}/scaledobjects/vllm")
    # metricType Value: the HPA multiplies by the pods, so the value is the mean, not the sum.
    kube.put(
        SCALED_OBJECT,
        scaled_object("vllm", NS, {"name": "vllm"}, [CPU_TRIGGER, external(metric_type="Value")]),
    )
    await eventually(lambda: _equals(value(scaler), 60))
    assert kube.count(f"/apis/keda.sh/v1alpha1/namespaces/{NS}/scaledobjects/vllm") == gets


async def test_pod_pages_follow_discovery_without_any_call_and_evaluation_wants_nothing(  # type: ignore[no-untyped-def]
    cluster: Cluster, kube_scaler, make_exporter
) -> None:
    from keda_gpu_scaler.demo.engines import EngineLoad, vllm_page

    metadata = {"metric": "requests", "threshold": "8"}
    servers = [await make_exporter(vllm_page("llama", [EngineLoad(1, i, 0.1)])) for i in range(2)]
    cluster.kube.put(DEPLOYMENT, deployment("chat", NS, {"app": "chat"}, replicas=2))
    cluster.kube.put(SCALED_OBJECT, scaled_object("chat", NS, {"name": "chat"}, [external(metadata)]))
    for index in range(2):
        cluster.kube.put(
            POD, pod(f"chat-{index}", NS, {"app": "chat"}, "node-a", ports=[("http", servers[index].port)])
        )
    scaler = await kube_scaler()
    spec = parse_trigger(metadata)
    # One call starts following the trigger; no other call is made from here on.
    with contextlib.suppress(grpc.aio.AioRpcError):
        await scaler.stub.IsActive(pb.ScaledObjectRef(name="chat", namespace=NS, scalerMetadata=metadata))

    async def scraped(expected: set[str]) -> None:
        assert cluster.scraped(scaler) & {s.url for s in servers} == expected

    await eventually(lambda: scraped({servers[0].url, servers[1].url}))
    cluster.kube.delete(POD, NS, "chat-0")
    await eventually(lambda: scraped({servers[1].url}))
    # An evaluation reads: it neither adds nor removes a page.
    followed = scaler.app.registry.get(NS, "chat")
    before = cluster.scraped(scaler)
    with contextlib.suppress(Exception):
        scaler.app.evaluator.evaluate(followed, spec)
    assert cluster.scraped(scaler) == before


async def test_a_large_pod_list_is_decoded_off_the_loop(
    kube: FakeKube, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unpaginated list of a large cluster is megabytes of JSON: decoded in a worker thread, a pod at
    a time, so that the event loop keeps answering RPCs meanwhile."""
    import threading

    from keda_gpu_scaler.kubernetes import api
    from keda_gpu_scaler.pages.jsonpieces import OFF_LOOP_BYTES

    threads: list[str] = []
    real = api.loads_in_pieces

    def recording(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "loads_in_pieces", recording)
    for index in range(OFF_LOOP_BYTES // 400):
        kube.put(POD, pod(f"vllm-{index}", NS, APP, "node-a"), notify=False)
    api_client = await api.connect(str(kube.kubeconfig(tmp_path)))
    try:
        listing = await api.KubeApi(api_client).list_pods(NS, None)
    finally:
        await api_client.close()
    assert len(listing["items"]) == OFF_LOOP_BYTES // 400
    assert threads and threading.main_thread().name not in threads


async def test_a_target_with_replicas_but_no_pod_is_unavailable_never_zero(  # type: ignore[no-untyped-def]
    cluster: Cluster, kube_scaler
) -> None:
    # SPEC §4: no Ready target pod while the target has replicas is UNAVAILABLE. A ResourceQuota or an
    # admission webhook can keep a Deployment of 2 replicas without any pod: 0 would let KEDA scale it
    # to zero, and the HPA read it as idle.
    await cluster.gpu_node("node-a")
    cluster.kube.put(DEPLOYMENT, deployment("vllm", NS, APP, replicas=2))
    cluster.kube.put(SCALED_OBJECT, scaled_object("vllm", NS, {"name": "vllm"}, [external()]))
    scaler = await kube_scaler()
    await eventually(lambda: unavailable(scaler, "2 replicas", "no pod"))
    # Scaled to zero (KEDA writes /scale): an answer again, 0 and inactive.
    cluster.kube.put(DEPLOYMENT, deployment("vllm", NS, APP, replicas=0))
    await eventually(lambda: _equals(value(scaler), 0))
    assert (await scaler.stub.IsActive(ref())).result is False


async def serving_one_pod(cluster: Cluster, kube_scaler: Any) -> Any:
    """A Deployment of 1 replica whose pod vllm-0 reads 40, its ScaledObject answered: the scaler."""
    await cluster.gpu_node("node-a")
    cluster.kube.put(DEPLOYMENT, deployment("vllm", NS, APP, replicas=1))
    cluster.kube.put(SCALED_OBJECT, scaled_object("vllm", NS, {"name": "vllm"}, [external()]))
    cluster.run("vllm-0", "node-a", 40)
    scaler = await kube_scaler()
    await eventually(lambda: _equals(value(scaler), 40))
    return scaler


async def test_pods_gone_while_the_target_keeps_its_replicas_is_unavailable(  # type: ignore[no-untyped-def]
    cluster: Cluster, kube_scaler
) -> None:
    scaler = await serving_one_pod(cluster, kube_scaler)
    # Evicted, and its replacement refused (a quota): the Deployment still asks for 1.
    cluster.remove("vllm-0")
    await eventually(lambda: unavailable(scaler, "1 replica", "no pod"))
    # Scaled to zero as KEDA does it: /scale first, then the pods go; a pod created again counts again.
    cluster.kube.put(DEPLOYMENT, deployment("vllm", NS, APP, replicas=0))
    await eventually(lambda: _equals(value(scaler), 0))


async def test_a_tenants_look_alike_exporter_pod_is_never_read(  # type: ignore[no-untyped-def]
    cluster: Cluster, kube_scaler, make_exporter
) -> None:
    # SPEC §3: where data comes from is the operator's choice. A tenant's ordinary pod on a GPU node it
    # shares with `llm`, labelled like the operator's exporter, serving idle GPUs for llm's pod vllm-0.
    real = await cluster.gpu_node("node-a")
    await cluster.gpu_node("node-b")
    three_pods_on_two_nodes(cluster)
    fake = await make_exporter(dcgm_page([GpuLine(NS, "vllm-0", 0, gpu=g) for g in (1, 2, 3)], host="fake"))
    cluster.kube.put(
        POD, pod("looks-like-dcgm", "evil", EXPORTER_LABELS, "node-a", ports=[("metrics", fake.port)])
    )
    scaler = await kube_scaler()
    await eventually(lambda: _equals(value(scaler), 180))
    # node-a's pages are scraped together: three more scrapes of its real exporter, none of the look-alike.
    seen = real.requests
    await eventually(lambda: _scraped_since(real, seen, 3))
    assert (await value(scaler), fake.requests) == (180, 0)


async def test_exporter_namespaces_star_reads_exporters_of_any_namespace(  # type: ignore[no-untyped-def]
    cluster: Cluster, kube_scaler
) -> None:
    three_pods_on_two_nodes(cluster)
    exporter = await cluster.make_exporter()
    cluster.kube.put(
        POD, pod("dcgm-a", "monitoring", EXPORTER_LABELS, "node-a", ports=[("metrics", exporter.port)])
    )
    cluster.exporters["node-a"] = exporter
    cluster.run("vllm-2", "node-a", 70)  # all three on node-a
    scaler = await kube_scaler(exporter_namespaces=None)
    await eventually(lambda: _equals(value(scaler), 180))


async def _scraped_since(exporter: ExporterServer, seen: int, more: int) -> None:
    assert exporter.requests >= seen + more


async def test_metric_type_value_with_starting_pods_asks_as_many_replicas_as_average_value(  # type: ignore[no-untyped-def]
    cluster: Cluster, kube_scaler
) -> None:
    # The HPA multiplies a Value metric by its ready pods (getReadyPodsCount: Running and Ready), so `mean`
    # is over them: over every pod, the two loading their model diluted it and the HPA asked for 2 of 4
    # replicas (the ReplicaSet removes unready pods first: the loading ones).
    await cluster.gpu_node("node-a")
    cluster.kube.put(DEPLOYMENT, deployment("vllm", NS, APP, replicas=4))
    cluster.run("vllm-0", "node-a", 10)
    cluster.run("vllm-1", "node-a", 10)
    cluster.run("vllm-2", "node-a", 0, ready=False)
    cluster.run("vllm-3", "node-a", 0, ready=False)
    scaler = await kube_scaler()

    async def answered(metric_type: str) -> tuple[float, dict[str, Any]]:
        cluster.kube.put(
            SCALED_OBJECT, scaled_object("vllm", NS, {"name": "vllm"}, [external(metric_type=metric_type)])
        )

        async def check() -> tuple[float, dict[str, Any]]:
            got = await value(scaler)
            explained = await explain(scaler)
            assert explained.get("discovery", {}).get("metricType") == metric_type, explained
            assert explained.get("startingPods") == ["vllm-2", "vllm-3"], explained
            return got, explained

        return await eventually(check)

    summed, _ = await answered("AverageValue")
    meaned, explained = await answered("Value")
    assert summed == 10 + 10 + 2 * 70  # S + U × T: a starting pod never causes a scale-down
    assert meaned == summed / 2  # per Ready pod
    assert math.ceil(2 * meaned / 70) == math.ceil(summed / 70) == 3
    # /explain's what-if multiplies by the Ready pods too.
    assert explained["hpa"]["readyReplicas"] == 2 and explained["hpa"]["desiredReplicasValue"] == 3


async def narrow_rbac_with_exporter_urls(cluster: Cluster, make_scaler, tmp_path: Path) -> Any:  # type: ignore[no-untyped-def]
    """The chart's narrow RBAC (rbac.namespaces, rbac.exporterDiscovery: false) with flags.exporterUrl: pods
    of `llm` only; listing pods cluster-wide is refused. The exporters are given."""
    a = await cluster.gpu_node("node-a")
    b = await cluster.gpu_node("node-b")
    three_pods_on_two_nodes(cluster)
    cluster.kube.deny("list", "pods", None)
    cluster.kube.deny("watch", "pods", None)
    return await make_scaler(
        a,
        b,
        kubernetes="on",
        kubeconfig=str(cluster.kube.kubeconfig(tmp_path)),
        exporter_selectors=(parse_exporter_selector("app=test-dcgm-exporter:metrics"),),
        discovery_interval=0.2,
    )


async def test_exporter_urls_need_no_cluster_wide_pod_watch(  # type: ignore[no-untyped-def]
    cluster: Cluster, make_scaler, tmp_path: Path
) -> None:
    scaler = await narrow_rbac_with_exporter_urls(cluster, make_scaler, tmp_path)
    await eventually(lambda: _equals(value(scaler), 180), timeout=15)


async def test_exporter_urls_replace_the_exporter_pod_watch(  # type: ignore[no-untyped-def]
    cluster: Cluster, make_scaler, tmp_path: Path
) -> None:
    # --exporter-url replaces the discovery of exporter pods: the refused cluster-wide watch is never tried,
    # so no warning repeats and watch_restarts_total{reason="error"} (the chart's KedaGpuScalerKubernetesErrors
    # alert) stays at 0 in this documented setup.
    scaler = await narrow_rbac_with_exporter_urls(cluster, make_scaler, tmp_path)
    await eventually(lambda: _equals(value(scaler), 180), timeout=15)
    await asyncio.sleep(0.5)  # room for a watch that was started to be refused
    assert await value(scaler) == 180
    restarts = scaler.app.discovery.watch_restarts.labels("error")._value.get()
    assert (cluster.kube.count("/api/v1/pods"), restarts) == (0, 0)


async def test_pods_gone_before_the_scale_target_is_read_again_is_never_zero(  # type: ignore[no-untyped-def]
    cluster: Cluster, kube_scaler, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The only pod evicted while its Deployment asks for 1: until a /scale read begun after it went came
    # back (a slow API server: up to its 10 s timeout), GetMetrics read 0 and IsActive false.
    from keda_gpu_scaler.kubernetes import api as kube_api

    scaler = await serving_one_pod(cluster, kube_scaler)
    real_scale = kube_api.KubeApi.scale

    async def slow_scale(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        await asyncio.sleep(3.0)  # an API server slow to answer
        return await real_scale(self, *args, **kwargs)

    monkeypatch.setattr(kube_api.KubeApi, "scale", slow_scale)
    cluster.remove("vllm-0")
    answers: list[object] = []
    deadline = asyncio.get_running_loop().time() + 2.5
    while asyncio.get_running_loop().time() < deadline:
        try:
            got: object = await value(scaler)
        except grpc.aio.AioRpcError as error:
            got = error.code()
        if got != 40:
            answers.append(got)
        await asyncio.sleep(0.05)
    assert answers and set(answers) == {grpc.StatusCode.UNAVAILABLE}, answers[:5]
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await scaler.stub.IsActive(ref())
    assert raised.value.code() is grpc.StatusCode.UNAVAILABLE
