"""`metric: demand` with Kubernetes on: each Ready target pod's own page, a starting pod per SPEC §4."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fake_kube import DEPLOYMENT, POD, SCALED_OBJECT, FakeKube, deployment, pod, scaled_object
from support import eventually

from keda_gpu_scaler._proto import externalscaler_pb2 as pb

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
