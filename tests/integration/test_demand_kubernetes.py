"""`metric: demand` with Kubernetes on: each Ready target pod's own page, a starting pod per SPEC §4."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any

import grpc
from conftest import FAST
from fake_kube import DEPLOYMENT, POD, SCALED_OBJECT, FakeKube, deployment, pod, scaled_object
from support import ExporterServer, eventually

from keda_gpu_scaler.app import App
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb
from keda_gpu_scaler.externalscaler import externalscaler_pb2_grpc as pb_grpc

NS = "llm"
DEMAND = {"metric": "demand", "threshold": "4", "scalerAddress": "keda-gpu-scaler.keda:6000"}


def page(finished: float) -> str:
    return (
        'vllm:num_requests_running{engine="0"} 0\nvllm:num_requests_waiting{engine="0"} 0\n'
        f'vllm:request_success_total{{engine="0",finished_reason="stop"}} {finished}\n'
    )


async def test_an_idle_fleet_with_a_starting_pod_holds_its_size(
    make_exporter, make_scaler, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    kube = FakeKube()
    await kube.start()
    try:
        servers = [await make_exporter(page(100 * i)) for i in range(3)]
        kube.put(DEPLOYMENT, deployment("chat", NS, {"app": "chat"}, replicas=3))
        trigger: dict[str, Any] = {"type": "external", "metadata": DEMAND}
        kube.put(SCALED_OBJECT, scaled_object("chat", NS, {"name": "chat"}, [trigger]))
        for index in range(2):
            kube.put(
                POD,
                pod(f"chat-{index}", NS, {"app": "chat"}, "node-a", ports=[("http", servers[index].port)]),
            )
        # Loading its model: not Ready, its page is not read.
        kube.put(
            POD, pod("chat-2", NS, {"app": "chat"}, "node-a", ready=False, ports=[("http", servers[2].port)])
        )
        scaler = await make_scaler(
            kubernetes="on", kubeconfig=str(kube.kubeconfig(tmp_path)), discovery_interval=0.2
        )
        request = pb.GetMetricsRequest(
            scaledObjectRef=pb.ScaledObjectRef(name="chat", namespace=NS, scalerMetadata=DEMAND),
            metricName="inference-demand",
        )

        async def held() -> None:
            response = await scaler.stub.GetMetrics(request)
            # The Ready pods' counters do not move (0 requests/s each, once each has two pages); the
            # starting pod adds capacity, not load, and under the HPA's rule it holds the size: 0 + 1 × 4.
            assert response.metricValues[0].metricValueFloat == 4

        await eventually(held)
        assert servers[2].requests == 0
        active = await scaler.stub.IsActive(
            pb.ScaledObjectRef(name="chat", namespace=NS, scalerMetadata=DEMAND)
        )
        assert active.result is False
    finally:
        await kube.stop()


async def test_two_pages_of_one_pod_each_give_their_own_trigger_its_own_rate(tmp_path: Path) -> None:
    """One pod, two servers (one per container, each its metricsPort): each trigger reads its own page,
    and each page has its own history (SPEC §6: a history belongs to one page)."""
    kube = FakeKube()
    await kube.start()
    servers = [ExporterServer(page=page(0)), ExporterServer(page=page(0))]
    for server in servers:
        await server.start()
    triggers = [
        {**DEMAND, "metricsPort": str(server.port), "metricName": f"demand-{index}"}
        for index, server in enumerate(servers)
    ]
    now = [1000.0]
    settings = dataclasses.replace(
        FAST,
        kubernetes="on",
        kubeconfig=str(kube.kubeconfig(tmp_path)),
        discovery_interval=0.2,
        max_staleness=100.0,  # the test's clock moves in jumps
    )
    app = App(settings, clock=lambda: now[0])
    channel = grpc.aio.insecure_channel("127.0.0.1:1")
    try:
        kube.put(DEPLOYMENT, deployment("chat", NS, {"app": "chat"}, replicas=1))
        specs: list[dict[str, Any]] = [{"type": "external", "metadata": t} for t in triggers]
        kube.put(SCALED_OBJECT, scaled_object("chat", NS, {"name": "chat"}, specs))
        ports = [("http", servers[0].port), ("admin", servers[1].port)]
        kube.put(POD, pod("chat-0", NS, {"app": "chat"}, "node-a", ports=ports))
        await app.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}")
        stub = pb_grpc.ExternalScalerStub(channel)

        async def value(metadata: dict[str, str]) -> float:
            ref = pb.ScaledObjectRef(name="chat", namespace=NS, scalerMetadata=metadata)
            request = pb.GetMetricsRequest(scaledObjectRef=ref, metricName=metadata["metricName"])
            response = await stub.GetMetrics(request)
            return response.metricValues[0].metricValueFloat

        async def shown(at: float, finished: tuple[float, float]) -> None:
            now[0] = at
            for server, count in zip(servers, finished, strict=True):
                server.page = page(count)
            seen = [server.requests for server in servers]

            async def read_twice() -> None:
                for metadata in triggers:  # a trigger asking keeps its pages wanted
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        await value(metadata)
                assert all(s.requests >= before + 2 for s, before in zip(servers, seen, strict=True))

            await eventually(read_twice)

        await shown(1000, (0, 0))
        await shown(1030, (300, 60))
        # 300 finished over 30 s on the first page, 60 on the second: 10/s and 2/s, each its own.
        assert [await value(metadata) for metadata in triggers] == [10, 2]
    finally:
        await channel.close()
        await app.stop()
        for server in servers:
            await server.stop()
        await kube.stop()


async def test_another_workloads_failing_page_is_never_named_in_this_ones_answer(
    make_exporter, make_scaler, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """Two workloads in one namespace: the other's pod page failing is not this trigger's to name, whether
    its own pods answer or not (its own pods' problems are named)."""
    kube = FakeKube()
    await kube.start()
    try:
        chat, code = await make_exporter(page(0)), await make_exporter(page(0))
        code.status = 500
        requests = {"metric": "requests", "threshold": "8"}
        for name, server in (("chat", chat), ("code", code)):
            kube.put(DEPLOYMENT, deployment(name, NS, {"app": name}, replicas=1))
            trigger: dict[str, Any] = {"type": "external", "metadata": requests}
            kube.put(SCALED_OBJECT, scaled_object(name, NS, {"name": name}, [trigger]))
            kube.put(POD, pod(f"{name}-0", NS, {"app": name}, "node-a", ports=[("http", server.port)]))
        scaler = await make_scaler(
            kubernetes="on", kubeconfig=str(kube.kubeconfig(tmp_path)), discovery_interval=0.2
        )

        def ask(name: str) -> Any:
            ref = pb.ScaledObjectRef(name=name, namespace=NS, scalerMetadata=requests)
            return scaler.stub.GetMetrics(
                pb.GetMetricsRequest(scaledObjectRef=ref, metricName="inference-requests")
            )

        async def code_failing_chat_answered() -> None:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await ask("code")  # followed too, so its page is read (and fails)
            assert code.requests > 0
            assert (await ask("chat")).metricValues[0].metricValueFloat == 0

        await eventually(code_failing_chat_answered)
        chat.status = 500

        async def chat_unavailable_naming_only_its_own() -> None:
            try:
                await ask("chat")
            except grpc.aio.AioRpcError as error:
                details = error.details() or ""
                assert error.code() is grpc.StatusCode.UNAVAILABLE and f"chat-0: {chat.url}" in details, (
                    details
                )
                assert code.url not in details and "code-0" not in details, details
                return
            raise AssertionError("chat still answered")

        await eventually(chat_unavailable_naming_only_its_own)
    finally:
        await kube.stop()
