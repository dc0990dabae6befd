"""Waking from zero with Kubernetes on: InferencePool → picker Service → Ready pods, end to end over gRPC.

The real kubernetes_asyncio client against the fake API server, real loopback endpoint-picker pages,
real gRPC calls: a ScaledObject with a `pending` trigger and its workload at zero replicas.
"""

from __future__ import annotations

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
from support import ExporterServer, eventually

from keda_gpu_scaler.demo.epp import Queued, epp_page
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb

NS = "llm"
EPP = {"app": "chat-pool-epp"}


@pytest.fixture
async def epp(make_exporter: Callable[..., Awaitable[ExporterServer]]) -> ExporterServer:
    return await make_exporter(epp_page("chat-pool", {Queued("llama", "team-a"): 3}))


def metadata(epp: ExporterServer, pool: str = "chat-pool") -> dict[str, str]:
    # Every fake pod has IP 127.0.0.1: the picker's metrics port is the loopback page's.
    return {"metric": "pending", "threshold": "4", "inferencePool": pool, "gatewayMetricsPort": str(epp.port)}


@pytest.fixture
async def scaler(
    make_scaler: Callable[..., Awaitable[Any]], kube: FakeKube, tmp_path: Path, epp: ExporterServer
) -> Any:
    kube.put(DEPLOYMENT, deployment("chat", NS, {"app": "vllm"}, replicas=0))
    trigger = {
        "type": "external",
        "metadata": {**metadata(epp), "scalerAddress": "keda-gpu-scaler.keda:6000"},
    }
    kube.put(SCALED_OBJECT, scaled_object("chat", NS, {"name": "chat"}, [trigger]))
    return await make_scaler(
        kubernetes="on",
        kubeconfig=str(kube.kubeconfig(tmp_path)),
        discovery_interval=0.2,
        gateway_interval=0.05,
    )


def ref(epp: ExporterServer) -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name="chat", namespace=NS, scalerMetadata=metadata(epp))


async def value_is(scaler: Any, epp: ExporterServer, expected: float) -> None:
    async def check() -> None:
        request = pb.GetMetricsRequest(scaledObjectRef=ref(epp), metricName="gateway-pending")
        response = await scaler.stub.GetMetrics(request)
        assert response.metricValues[0].metricValueFloat == expected

    await eventually(check)


async def unavailable_saying(scaler: Any, epp: ExporterServer, *words: str) -> str:
    async def check() -> str:
        try:
            await scaler.stub.IsActive(ref(epp))
        except grpc.aio.AioRpcError as error:
            assert error.code() is grpc.StatusCode.UNAVAILABLE, error
            message = error.details() or ""
            for word in words:
                assert word in message, message
            return message
        raise AssertionError("IsActive answered")

    return await eventually(check)


def picker(kube: FakeKube, *, ready: bool = True, **ref: str) -> None:
    kube.put(INFERENCE_POOL, inference_pool("chat-pool", NS, "chat-pool-epp", **ref))  # type: ignore[arg-type]
    kube.put(SERVICE, service("chat-pool-epp", NS, EPP))
    kube.put(POD, pod("chat-pool-epp-0", NS, EPP, "node-a", ready=ready, ip="127.0.0.1"))


async def test_the_pool_s_picker_pods_are_found_and_wake_the_workload(
    scaler: Any, kube: FakeKube, epp: ExporterServer
) -> None:
    picker(kube)
    await value_is(scaler, epp, 3)
    assert (await scaler.stub.IsActive(ref(epp))).result is True
    epp.page = epp_page("chat-pool", {})
    await value_is(scaler, epp, 0)
    assert (await scaler.stub.IsActive(ref(epp))).result is False


async def test_a_pool_created_later_is_read_without_a_restart(
    scaler: Any, kube: FakeKube, epp: ExporterServer
) -> None:
    kube.put(SERVICE, service("chat-pool-epp", NS, EPP))
    kube.put(POD, pod("chat-pool-epp-0", NS, EPP, "node-a", ip="127.0.0.1"))
    await unavailable_saying(scaler, epp, "InferencePool llm/chat-pool does not exist")
    kube.put(INFERENCE_POOL, inference_pool("chat-pool", NS, "chat-pool-epp"))
    await value_is(scaler, epp, 3)


async def test_a_picker_that_is_not_a_service_is_unavailable_naming_its_kind(
    scaler: Any, kube: FakeKube, epp: ExporterServer
) -> None:
    picker(kube, kind="EndpointPicker", group="llm-d.ai")
    await unavailable_saying(scaler, epp, "'EndpointPicker'", "not a Service")
    assert epp.requests == 0


async def test_no_ready_picker_pod_is_unavailable_naming_the_pool(
    scaler: Any, kube: FakeKube, epp: ExporterServer
) -> None:
    picker(kube, ready=False)
    await unavailable_saying(scaler, epp, "no Ready endpoint picker pod", "InferencePool llm/chat-pool")
    kube.put(POD, pod("chat-pool-epp-0", NS, EPP, "node-a", ip="127.0.0.1"))
    await value_is(scaler, epp, 3)


async def test_a_ready_picker_pod_that_cannot_be_reached_is_never_left_out(
    scaler: Any, kube: FakeKube, epp: ExporterServer
) -> None:
    """SPEC §7: a Ready replica the scaler cannot reach (its metrics server hung, a NetworkPolicy) may hold
    every request: the others' sum is a lower bound, and their empty queue is no 0 and no `false`."""
    picker(kube)
    # The second replica's address refuses connections on the metrics port (the loopback page is
    # served on 127.0.0.1 only).
    kube.put(POD, pod("chat-pool-epp-1", NS, EPP, "node-a", ip="127.0.0.2"))
    await value_is(scaler, epp, 3)
    epp.page = epp_page("chat-pool", {})
    message = await unavailable_saying(scaler, epp, "chat-pool-epp-1", "cannot be read")
    assert "not reachable on metrics port" in message


@pytest.mark.parametrize(
    ("status", "words"),
    [
        (401, ("HTTP 401", "plain HTTP", "--gateway-ca-file")),
        (403, ("HTTP 403", "`get` on the non-resource URL /metrics")),
    ],
)
async def test_a_picker_refusing_the_scaler_is_unavailable_saying_what_is_missing(
    scaler: Any, kube: FakeKube, epp: ExporterServer, status: int, words: tuple[str, ...]
) -> None:
    epp.status = status
    picker(kube)
    await unavailable_saying(scaler, epp, *words)


async def test_a_pool_of_another_namespace_is_never_read(
    scaler: Any, kube: FakeKube, epp: ExporterServer
) -> None:
    # The pool exists, with a Ready picker, only in namespace "other".
    kube.put(INFERENCE_POOL, inference_pool("chat-pool", "other", "chat-pool-epp"))
    kube.put(SERVICE, service("chat-pool-epp", "other", EPP))
    kube.put(POD, pod("chat-pool-epp-0", "other", EPP, "node-a", ip="127.0.0.1"))
    await unavailable_saying(scaler, epp, "InferencePool llm/chat-pool does not exist")
    assert epp.requests == 0
    assert not [path for path, _ in kube.requests if "/namespaces/other/" in path]


async def test_watches_failing_after_their_first_list_keep_the_pickers_read(
    scaler: Any, kube: FakeKube, epp: ExporterServer
) -> None:
    kube.put(INFERENCE_POOL, inference_pool("chat-pool", NS, "chat-pool-epp"))
    kube.put(SERVICE, service("chat-pool-epp", NS, EPP))
    kube.put(POD, pod("chat-pool-epp-0", NS, EPP, "node-a", ip="127.0.0.1"))
    await value_is(scaler, epp, 3)
    # The API server refuses the pool's, the Service's and the pods' watches for a while.
    for resource in ("inferencepools.inference.networking.k8s.io", "services", "pods"):
        kube.deny("watch", resource, NS)
        kube.deny("list", resource, NS)
    watches = kube.count(f"/apis/inference.networking.k8s.io/v1/namespaces/{NS}/inferencepools")
    kube.end_watches()

    async def refused_twice_yet_read() -> None:
        assert (
            kube.count(f"/apis/inference.networking.k8s.io/v1/namespaces/{NS}/inferencepools") >= watches + 2
        )
        await value_is(scaler, epp, 3)

    await eventually(refused_twice_yet_read)
