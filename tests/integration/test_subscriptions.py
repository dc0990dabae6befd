"""What is collected follows each trigger's subscription, with Kubernetes on, end to end over gRPC.

A trigger edited out of its ScaledObject stops its scrapes once discovery reads the edit; two triggers
on one pool each read it at their own port; a `pending`-only ScaledObject watches no pods; and one
ScaledObject naming thousands of pools leaves a bounded number of watches and tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from fake_kube import (
    DEPLOYMENT,
    INFERENCE_POOL,
    POD,
    SCALED_OBJECT,
    SERVICE,
    FakeKube,
    deployment,
    inference_pool,
    pod,
    scaled_object,
    service,
)
from support import ExporterServer, GpuLine, dcgm_page, eventually

from keda_gpu_scaler.core.selectors import parse_exporter_selector
from keda_gpu_scaler.demo.epp import Queued, epp_page
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb

NS = "llm"
ADDRESS = {"scalerAddress": "keda-gpu-scaler.keda:6000"}
GPU = {"threshold": "70"}
EPP = {"app": "chat-pool-epp"}
EXPORTER_LABELS = {"app": "test-dcgm-exporter"}


@pytest.fixture
def kube_scaler(make_scaler: Callable[..., Awaitable[Any]], kube: FakeKube, tmp_path: Path) -> Any:
    async def make() -> Any:
        return await make_scaler(
            kubernetes="on",
            kubeconfig=str(kube.kubeconfig(tmp_path)),
            exporter_selectors=(parse_exporter_selector("app=test-dcgm-exporter:metrics"),),
            discovery_interval=0.2,
            gateway_interval=0.05,
        )

    return make


def external(metadata: dict[str, str]) -> dict[str, Any]:
    return {"type": "external", "metadata": {**metadata, **ADDRESS}}


def pending(epp_port: int | str, pool: str = "chat-pool") -> dict[str, str]:
    # Every fake pod has IP 127.0.0.1: the picker's metrics port is the loopback page's.
    return {"metric": "pending", "threshold": "4", "inferencePool": pool, "gatewayMetricsPort": str(epp_port)}


def ref(name: str, metadata: dict[str, str]) -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name=name, namespace=NS, scalerMetadata=metadata)


async def value(scaler: Any, name: str, metadata: dict[str, str]) -> float:
    metric = "gateway-pending" if metadata.get("metric") == "pending" else "gpu-utilization"
    request = pb.GetMetricsRequest(scaledObjectRef=ref(name, metadata), metricName=metric)
    response = await scaler.stub.GetMetrics(request)
    result: float = response.metricValues[0].metricValueFloat
    return result


async def value_is(scaler: Any, name: str, metadata: dict[str, str], expected: float) -> None:
    async def check() -> None:
        assert await value(scaler, name, metadata) == expected

    await eventually(check)


async def call(scaler: Any, name: str, metadata: dict[str, str]) -> None:
    """One call about a trigger, whatever it answers (KEDA calls what the ScaledObject says now)."""
    with contextlib.suppress(grpc.aio.AioRpcError):
        await scaler.stub.IsActive(ref(name, metadata))


def scraped(scaler: Any) -> set[str]:
    return {s.source for s in scaler.app.store.sources()}


def picker(kube: FakeKube) -> None:
    kube.put(INFERENCE_POOL, inference_pool("chat-pool", NS, "chat-pool-epp"))
    kube.put(SERVICE, service("chat-pool-epp", NS, EPP))
    kube.put(POD, pod("chat-pool-epp-0", NS, EPP, "node-a", ip="127.0.0.1"))


@pytest.fixture
async def epp(make_exporter: Callable[..., Awaitable[ExporterServer]]) -> ExporterServer:
    return await make_exporter(epp_page("chat-pool", {Queued("llama", "team-a"): 3}))


async def gpu_node(
    kube: FakeKube, make_exporter: Callable[..., Awaitable[ExporterServer]], node: str, lines: list[GpuLine]
) -> ExporterServer:
    exporter = await make_exporter(dcgm_page(lines, host=node))
    exporter_pod = pod(
        f"dcgm-{node}", "gpu-operator", EXPORTER_LABELS, node, ports=[("metrics", exporter.port)]
    )
    kube.put(POD, exporter_pod)
    return exporter


async def test_a_pod_selector_edited_away_stops_its_scrapes_when_discovery_reads_the_edit(
    kube: FakeKube, kube_scaler: Any, make_exporter: Callable[..., Awaitable[ExporterServer]]
) -> None:
    await gpu_node(kube, make_exporter, "node-a", [GpuLine(NS, "vllm-0", 50)])
    trainers = await gpu_node(kube, make_exporter, "node-c", [GpuLine(NS, "trainer-0", 99)])
    kube.put(DEPLOYMENT, deployment("vllm", NS, {"app": "vllm"}, replicas=1))
    kube.put(POD, pod("vllm-0", NS, {"app": "vllm"}, "node-a"))
    kube.put(POD, pod("trainer-0", NS, {"app": "trainer"}, "node-c"))
    selected = {**GPU, "podSelector": "app=trainer"}
    kube.put(SCALED_OBJECT, scaled_object("vllm", NS, {"name": "vllm"}, [external(selected)]))
    scaler = await kube_scaler()
    await value_is(scaler, "vllm", selected, 99)
    assert trainers.url in scraped(scaler)
    # The podSelector is edited away; KEDA calls with the new metadata from then on.
    kube.put(SCALED_OBJECT, scaled_object("vllm", NS, {"name": "vllm"}, [external(GPU)]))
    await value_is(scaler, "vllm", GPU, 50)

    async def stopped() -> None:
        assert trainers.url not in scraped(scaler)

    await eventually(stopped)


async def test_a_pending_trigger_edited_away_stops_its_scrapes_and_its_pool_watch(
    kube: FakeKube, kube_scaler: Any, epp: ExporterServer
) -> None:
    picker(kube)
    kube.put(DEPLOYMENT, deployment("chat", NS, {"app": "vllm"}, replicas=0))
    kube.put(SCALED_OBJECT, scaled_object("chat", NS, {"name": "chat"}, [external(pending(epp.port))]))
    scaler = await kube_scaler()
    await value_is(scaler, "chat", pending(epp.port), 3)
    assert epp.url in scraped(scaler)
    # The trigger now reads another pool; KEDA calls with the new metadata.
    kube.put(
        SCALED_OBJECT, scaled_object("chat", NS, {"name": "chat"}, [external(pending(epp.port, "code"))])
    )

    async def stopped() -> None:
        await call(scaler, "chat", pending(epp.port, "code"))
        assert epp.url not in scraped(scaler)
        kube.bookmark()  # the fake server notices a closed watch when it next writes to it
        assert not [w for w in kube.watchers if w.kind.plural in ("services", "pods") and w.namespace == NS]

    await eventually(stopped)


async def test_two_triggers_on_one_pool_each_read_it_at_their_own_port(
    kube: FakeKube, kube_scaler: Any, epp: ExporterServer
) -> None:
    """A port typo in one ScaledObject's trigger (port 1: nothing listens there) is its own problem."""
    picker(kube)
    kube.put(DEPLOYMENT, deployment("chat", NS, {"app": "vllm"}, replicas=0))
    kube.put(SCALED_OBJECT, scaled_object("good", NS, {"name": "chat"}, [external(pending(epp.port))]))
    kube.put(SCALED_OBJECT, scaled_object("typo", NS, {"name": "chat"}, [external(pending(1))]))
    scaler = await kube_scaler()
    await call(scaler, "typo", pending(1))
    await value_is(scaler, "good", pending(epp.port), 3)

    async def typo_unavailable() -> None:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await value(scaler, "typo", pending(1))
        assert raised.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "metrics port 1" in (raised.value.details() or "")

    await eventually(typo_unavailable)
    await value_is(scaler, "good", pending(epp.port), 3)


async def test_a_scaled_object_whose_only_trigger_is_pending_watches_no_pods(
    kube: FakeKube, kube_scaler: Any, epp: ExporterServer
) -> None:
    picker(kube)
    kube.put(DEPLOYMENT, deployment("chat", NS, {"app": "vllm"}, replicas=0))
    kube.put(SCALED_OBJECT, scaled_object("chat", NS, {"name": "chat"}, [external(pending(epp.port))]))
    scaler = await kube_scaler()
    await value_is(scaler, "chat", pending(epp.port), 3)
    watched = sorted((w.kind.plural, w.namespace or "", w.selector) for w in kube.watchers)
    # The namespace's ScaledObjects and InferencePools, the picker's Service and its pods: not every pod.
    assert ("pods", NS, "") not in watched, watched
    assert ("pods", NS, "app=chat-pool-epp") in watched


async def test_thousands_of_pool_names_from_one_scaled_object_leave_bounded_watches_and_tasks(
    kube: FakeKube, kube_scaler: Any, epp: ExporterServer
) -> None:
    picker(kube)
    kube.put(DEPLOYMENT, deployment("chat", NS, {"app": "vllm"}, replicas=0))
    kube.put(SCALED_OBJECT, scaled_object("chat", NS, {"name": "chat"}, [external(pending(epp.port))]))
    scaler = await kube_scaler()
    await value_is(scaler, "chat", pending(epp.port), 3)
    kube.bookmark()
    tasks_before, watches_before = len(asyncio.all_tasks()), len(kube.watchers)
    for index in range(2_000):
        metadata = pending(epp.port, f"pool-{index}")
        await scaler.stub.GetMetricSpec(ref("chat", metadata))
    await value_is(scaler, "chat", pending(epp.port), 3)  # the real trigger is served again
    tasks_after = len(asyncio.all_tasks())
    kube.bookmark()
    watches_after = len(kube.watchers)
    print(  # the numbers the report quotes: pytest -s shows them
        f"asyncio tasks {tasks_before} -> {tasks_after}; watch connections {watches_before} -> {watches_after}"
    )
    # A pool name that does not exist costs a look-up in the namespace's one InferencePool watch.
    assert tasks_after <= tasks_before + 20
    assert watches_after <= watches_before + 4
    assert sum(1 for w in kube.watchers if w.kind.plural == "inferencepools") <= 1, [
        (w.kind.plural, w.namespace, w.selector, w.fields) for w in kube.watchers
    ]
