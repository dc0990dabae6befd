"""`source: prometheus` with Kubernetes on (the default in a cluster): discovery says which pods are the
target, a real Prometheus holds their series. The other Prometheus modules run without Kubernetes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from fake_kube import DEPLOYMENT, POD, SCALED_OBJECT, FakeKube, deployment, pod, scaled_object
from prometheus_support import PASSWORD, USERNAME, PrometheusServer, address_of, operator_labels
from support import ExporterServer, GpuLine, dcgm_page, eventually

from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb

pytestmark = pytest.mark.prometheus

NS = "kube-prom"


def vllm_page(running: int, waiting: int) -> str:
    return (
        f'vllm:num_requests_running{{engine="0",model_name="m"}} {running}\n'
        f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {waiting}\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
    )


@pytest.fixture
def targets(prometheus: PrometheusServer) -> Iterator[Any]:
    """Register a test's servers as targets of the `operator` job (honor_labels false), removed afterwards."""

    def register(*servers: tuple[ExporterServer, dict[str, str]]) -> None:
        prometheus.set_targets("operator", "kubeprom", [(address_of(s), labels) for s, labels in servers])

    yield register
    prometheus.set_targets("operator", "kubeprom", [])


async def kubernetes_scaler(
    make_scaler: Any, kube: FakeKube, prometheus: PrometheusServer, tmp_path: Path, **overrides: Any
) -> Any:
    return await make_scaler(
        kubernetes="on",
        kubeconfig=str(kube.kubeconfig(tmp_path)),
        discovery_interval=0.2,
        prometheus_url=prometheus.url,
        prometheus_username=USERNAME,
        prometheus_password=PASSWORD,
        prometheus_timeout=2.0,
        scrape_interval=0.5,
        max_staleness=3.0,
        prometheus_max_staleness=3.0,
        **overrides,
    )


async def value(scaler: Any, metadata: dict[str, str], metric_name: str, name: str = "chat") -> float:
    ref = pb.ScaledObjectRef(name=name, namespace=NS, scalerMetadata=metadata)
    try:
        response = await scaler.stub.GetMetrics(
            pb.GetMetricsRequest(scaledObjectRef=ref, metricName=metric_name)
        )
    except grpc.aio.AioRpcError as error:
        raise AssertionError(f"{error.code().name}: {error.details()}") from None
    result: float = response.metricValues[0].metricValueFloat
    return result


async def test_gpu_and_inference_series_of_the_discovered_target_pods(
    kube: FakeKube,
    make_exporter: Any,
    make_scaler: Any,
    prometheus: PrometheusServer,
    targets: Any,
    tmp_path: Path,
) -> None:
    """Both kinds of trigger read the target pods discovery finds, by their series in Prometheus: GPU
    series through the exporter (exported_namespace/exported_pod) and the pods' own engine series (the
    namespace/pod target labels). A pod of the namespace that is not the target's never counts."""
    exporter = await make_exporter(
        dcgm_page(
            [GpuLine(NS, "chat-0", 80, gpu=0), GpuLine(NS, "other-0", 30, gpu=1)], host="kube-prom-node"
        )
    )
    chat = await make_exporter(vllm_page(6, 2))
    other = await make_exporter(vllm_page(40, 40))
    targets(
        (exporter, operator_labels("dcgm-kube-prom")),
        (chat, {"namespace": NS, "pod": "chat-0", "container": "server"}),
        (other, {"namespace": NS, "pod": "other-0", "container": "server"}),
    )
    gpu = {"threshold": "70", "source": "prometheus"}
    requests = {"metric": "requests", "threshold": "8", "source": "prometheus"}
    triggers = [{"type": "external", "metadata": gpu}, {"type": "external", "metadata": requests}]
    kube.put(DEPLOYMENT, deployment("chat", NS, {"app": "chat"}))
    kube.put(SCALED_OBJECT, scaled_object("chat", NS, {"name": "chat"}, triggers))
    # No container port: through Prometheus, the pod's own page address plays no part.
    kube.put(POD, pod("chat-0", NS, {"app": "chat"}, "node-a"))
    kube.put(POD, pod("other-0", NS, {"app": "other"}, "node-a"))
    scaler = await kubernetes_scaler(make_scaler, kube, prometheus, tmp_path)

    async def read() -> None:
        assert await value(scaler, gpu, "gpu-utilization") == 80
        assert await value(scaler, requests, "inference-requests") == 8  # running 6 + waiting 2

    await eventually(read, timeout=20)
