"""The Prometheus source against a real Prometheus server scraping loopback exporters."""

from __future__ import annotations

import asyncio
import os
import re
import ssl
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from certs import CertificateAuthority, write
from prometheus_support import (
    JOBS,
    PASSWORD,
    USERNAME,
    ExporterThread,
    PrometheusProxy,
    PrometheusServer,
    address_of,
    operator_labels,
    with_timestamps,
)
from support import ExporterServer, GpuLine, dcgm_page, eventually

from keda_gpu_scaler.collect.http import client_session
from keda_gpu_scaler.collect.prometheus import PrometheusCollector
from keda_gpu_scaler.collect.prometheus_client import PrometheusClient
from keda_gpu_scaler.collect.store import Store
from keda_gpu_scaler.collect.wanted import WantedSources
from keda_gpu_scaler.config.settings import Settings
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb
from keda_gpu_scaler.externalscaler import externalscaler_pb2_grpc as pb_grpc
from keda_gpu_scaler.pages.promql import down_exporters_query, namespace_query
from keda_gpu_scaler.telemetry import Telemetry

pytestmark = pytest.mark.prometheus

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

# Every page of a kind the scaler reads, behind one of the two scrape jobs (see prometheus_support.JOBS).
FLEET = {
    "dcgm_2xh100.prom": "operator",
    "dcgm_virtual_gpus_pod_uid.prom": "operator",
    "dcgm_mig_no_gpu_util.prom": "operator",
    "dcgm_empty_pod_labels.prom": "operator",
    "amd_mi300x.prom": "operator",
    "ack_gpushare.prom": "operator",
    "dcgm_virtual_gpus.prom": "direct",
    "dcgm_old_namespace.prom": "direct",
    "dcgm_fb_total.prom": "direct",
    "dcgm_same_pod_two_namespaces.prom": "direct",
    "dcgm_4gpu_pod.prom": "direct",
    "dcgm_mig_gpu_util_zero.prom": "direct",
    "amd_mi300x_prefixed.prom": "direct",
}

# (namespace, podNamePrefix) of the workloads on those pages.
WORKLOADS = [
    ("llm", "vllm-qwen-"),  # NVIDIA, exported_pod
    ("llm", "vllm-llama-"),  # AMD, exported_pod
    ("llm", "embedder-"),  # MIG
    ("llm", "reranker-"),
    ("research", "trainer-"),  # AMD trainer-0 and a 4-GPU NVIDIA pod
    ("research", "train-"),  # ACK, exclusive GPU
    ("inference", "infer-"),  # ACK, shared GPU
    ("ml", "chat-"),  # time-sliced, --kubernetes-virtual-gpus, two exporters
    ("ml", "embed-"),
    ("docs", "ocr-"),
    ("audio", "whisper-"),  # --use-old-namespace
    ("vision", "detector-"),
    ("team-a", "worker-"),
    ("team-b", "worker-"),
    ("speech", "asr-"),
    ("chat", "sglang-"),  # AMD with the amd_ prefix
]

# Collection every 0.5 s from a Prometheus scraping every 1 s: data may be up to 3 s old.
THROUGH_PROMETHEUS: dict[str, Any] = {
    "scrape_interval": 0.5,
    "max_staleness": 3.0,
    "prometheus_max_staleness": 3.0,
    "prometheus_timeout": 2.0,
    "prometheus_username": USERNAME,
    "prometheus_password": PASSWORD,
    "default_source": "prometheus",
}


@dataclass
class Fleet:
    exporters: list[ExporterServer]


@pytest.fixture(scope="module")
def fleet(prometheus: PrometheusServer) -> Iterator[Fleet]:
    """Every fixture page served on loopback, scraped by Prometheus and queryable there."""
    thread = ExporterThread()
    exporters = []
    targets: dict[str, list[tuple[str, dict[str, str]]]] = {job: [] for job in JOBS}
    for index, (name, job) in enumerate(FLEET.items()):
        exporter = thread.start((FIXTURES / name).read_text())
        exporters.append(exporter)
        # Both jobs as a ServiceMonitor scrapes an exporter pod: with its own namespace/pod/container.
        targets[job].append((address_of(exporter), operator_labels(f"nvidia-dcgm-exporter-{index}")))
    for job, group in targets.items():
        prometheus.set_targets(job, "fleet", group)
    # Its own targets only: the session's Prometheus may still show another file's for a scrape or two.
    instances = "|".join(address_of(exporter) for exporter in exporters)  # a dot matches itself too
    deadline = time.monotonic() + 60
    while len(prometheus.query(f'up{{job=~"operator|direct",instance=~"{instances}"}} == 1')) < len(FLEET):
        assert time.monotonic() < deadline, "Prometheus did not scrape the fleet in time"
        time.sleep(0.1)
    yield Fleet(exporters)
    for job in JOBS:
        prometheus.set_targets(job, "fleet", [])
    thread.stop()


@pytest.fixture
async def proxy(prometheus: PrometheusServer) -> AsyncIterator[PrometheusProxy]:
    gateway = PrometheusProxy(prometheus.url)
    await gateway.start()
    yield gateway
    await gateway.stop()


@pytest.fixture
def test_targets(prometheus: PrometheusServer) -> Iterator[Any]:
    """Register a test's own exporters with Prometheus (removed afterwards)."""
    registered: set[str] = set()

    def register(
        job: str,
        *exporters: ExporterServer,
        exporter_pod: str = "nvidia-dcgm-exporter-t",
        target_labels: bool | None = None,
    ) -> None:
        """target_labels: give the targets a dcgm-exporter pod's own labels (default: the operator job)."""
        labels = (
            operator_labels(exporter_pod)
            if (job == "operator" if target_labels is None else target_labels)
            else {}
        )
        prometheus.set_targets(job, "test", [(address_of(e), labels) for e in exporters])
        registered.add(job)

    yield register
    for job in registered:
        prometheus.set_targets(job, "test", [])


def request(namespace: str, metadata: dict[str, str]) -> pb.GetMetricsRequest:
    name = "gpu-memory" if metadata.get("metric") == "memory" else "gpu-utilization"
    ref = pb.ScaledObjectRef(name="so", namespace=namespace, scalerMetadata=metadata)
    return pb.GetMetricsRequest(scaledObjectRef=ref, metricName=name)


async def outcome(scaler: Any, namespace: str, metadata: dict[str, str]) -> float | str:
    """The value, or the status code and message of the error."""
    try:
        response = await scaler.stub.GetMetrics(request(namespace, metadata))
    except grpc.aio.AioRpcError as error:
        return f"{error.code().name}: {error.details()}"
    value: float = response.metricValues[0].metricValueFloat
    return value


def trigger(prefix: str, **more: str) -> dict[str, str]:
    return {"podNamePrefix": prefix, "threshold": "70", **more}


# dcgm_2xh100: the pod's one GPU at 87 % (DCGM_FI_DEV_GPU_UTIL).
QWEN = trigger("vllm-qwen-")


async def _answers(scaler: Any, namespace: str, metadata: dict[str, str], value: float) -> None:
    async def check() -> None:
        assert await outcome(scaler, namespace, metadata) == value

    await eventually(check, timeout=20)


async def test_same_values_as_direct_scraping(
    fleet: Fleet, prometheus: PrometheusServer, make_scaler: Any
) -> None:
    # The operator job really relabelled: the workload's labels arrive as exported_namespace/exported_pod.
    assert prometheus.query('DCGM_FI_DEV_GPU_UTIL{exported_namespace="llm",exported_pod!=""}')
    direct = await make_scaler(*fleet.exporters)
    through = await make_scaler(
        prometheus_url=prometheus.url, **(THROUGH_PROMETHEUS | {"default_source": "scrape"})
    )
    cases = [
        (namespace, prefix, metric) for namespace, prefix in WORKLOADS for metric in ("utilization", "memory")
    ]

    async def same() -> None:
        scraped, queried = {}, {}
        for namespace, prefix, metric in cases:
            key = f"{namespace}/{prefix}*/{metric}"
            scraped[key] = await outcome(direct, namespace, trigger(prefix, metric=metric))
            # `source: prometheus` per trigger, on a server whose default is scrape.
            queried[key] = await outcome(
                through, namespace, trigger(prefix, metric=metric, source="prometheus")
            )
        assert all(isinstance(v, float) for v in scraped.values()), scraped
        assert any(v > 0 for v in scraped.values() if isinstance(v, float))
        assert queried == scraped

    await eventually(same, timeout=30)


@pytest.mark.parametrize("job", list(JOBS))
async def test_time_shared_pods_as_scraped_directly_with_either_honor_labels(
    prometheus: PrometheusServer, make_exporter: Any, make_scaler: Any, test_targets: Any, job: str
) -> None:
    """--kubernetes-virtual-gpus: each time-shared pod's own value is told from copies of the device's
    by the GPU's device-level series beside it. Scraped by a ServiceMonitor, that series carries the
    exporter pod's own namespace/pod target labels: moved to exported_* with honor_labels false, kept
    as its only pod labels with honor_labels true. Either way it is the exporter, not a workload pod."""
    # A namespace and an exporter pod of its own per case: the other job's series may linger in Prometheus.
    namespace, exporter_pod = f"shared-{job}", f"nvidia-dcgm-exporter-{job}"
    page = (FIXTURES / "dcgm_virtual_gpus_pod_uid.prom").read_text()
    exporter = await make_exporter(page.replace('namespace="ml"', f'namespace="{namespace}"'))
    test_targets(job, exporter, exporter_pod=exporter_pod, target_labels=True)
    # The device-level series really arrive with the exporter's own pod on them.
    device = f'DCGM_FI_DEV_GPU_UTIL{{job="{job}",pod="{exporter_pod}",exported_pod="",pod_uid=""}}'
    deadline = time.monotonic() + 30
    while len(prometheus.query(device)) != 2:
        assert time.monotonic() < deadline, "Prometheus did not scrape the exporter in time"
        await asyncio.sleep(0.2)
    direct = await make_scaler(exporter)
    through = await make_scaler(prometheus_url=prometheus.url, **THROUGH_PROMETHEUS)
    # Per pod (48 + 23, and 40), not the device's 71 % copied onto each pod.
    await _answers(direct, namespace, trigger("chat-"), 71.0)
    await _answers(direct, namespace, trigger("embed-"), 40.0)
    cases = [(prefix, metric) for prefix in ("chat-", "embed-") for metric in ("utilization", "memory")]

    async def same() -> None:
        scraped = {c: await outcome(direct, namespace, trigger(c[0], metric=c[1])) for c in cases}
        queried = {c: await outcome(through, namespace, trigger(c[0], metric=c[1])) for c in cases}
        assert all(isinstance(v, float) for v in scraped.values()), scraped
        assert queried == scraped

    await eventually(same, timeout=20)


async def test_default_source_prometheus_answers_triggers_without_source(
    fleet: Fleet, prometheus: PrometheusServer, make_scaler: Any
) -> None:
    scaler = await make_scaler(prometheus_url=prometheus.url, **THROUGH_PROMETHEUS)
    await _answers(scaler, "llm", QWEN, 87.0)
    async with aiohttp.ClientSession() as session, session.get(f"{scaler.http}/metrics") as response:
        text = await response.text()
    assert 'keda_gpu_scaler_prometheus_queries_total{query="namespace",result="ok"}' in text


async def test_few_queries_per_namespace(
    fleet: Fleet, proxy: PrometheusProxy, prometheus: PrometheusServer
) -> None:
    """One query per namespace and collection, plus one for the rest of its NVIDIA GPUs' series; an empty
    namespace also asks whether Prometheus has GPU series at all and whether an exporter target is down,
    at most once per interval."""
    # An exporter of an earlier test, stopped before its target was removed, may show down for a scrape.
    await eventually(lambda: _none_down(prometheus), timeout=20)
    settings = Settings(prometheus_url=proxy.url, prometheus_timeout=5.0)
    expected = {"llm": 2, "inference": 2, "chat": 1, "nothing-here": 3}
    async with client_session() as session:

        async def every_namespace_once() -> None:
            # A fresh collector each try: a fleet exporter's scrape that timed out on a busy machine shows
            # down (up 0) for one scrape, and an empty namespace is then rightly no answer (its down-check
            # cached for the interval), which says nothing of the query count.
            collector = PrometheusCollector(
                client=PrometheusClient(session, settings, Telemetry(), time.monotonic),
                store=Store(),
                wanted=WantedSources(),
                interval=30.0,
                max_staleness=60.0,
                clock=time.monotonic,
            )
            for namespace, queries in expected.items():
                before = proxy.requests
                assert await collector.collect_once(namespace), namespace
                assert proxy.requests - before == queries, namespace
            before = proxy.requests
            assert await collector.collect_once("nothing-either")
            assert proxy.requests - before == 1  # the fleet check is not repeated within an interval

        await eventually(every_namespace_once, timeout=30)


async def test_a_tenants_look_alike_exporter_scraped_by_prometheus_is_never_read(
    prometheus: PrometheusServer, make_exporter: Any, make_scaler: Any
) -> None:
    """A tenant's own pods, scraped by Prometheus (a PodMonitor of its namespace), print dcgm-exporter's
    series naming another tenant's pods: they arrive as exported_namespace/exported_pod. One claims an
    idle GPU of its own for the victim's pod; the other claims the victim's real GPU (its UUID) for a pod
    of the victim's that has none. As with direct scraping, only exporters in --exporter-namespaces
    (gpu-operator & co by default) speak for another namespace's pods; `*` reads any, as it does there."""
    real = await make_exporter(dcgm_page([GpuLine("victim", "victim-0", 90)], host="victim-node"))
    idle = await make_exporter(dcgm_page([GpuLine("victim", "victim-0", 0)], host="attacker-node"))
    same_gpu = await make_exporter(dcgm_page([GpuLine("victim", "victim-1", 100)], host="victim-node"))
    attacker = {"namespace": "attacker", "pod": "innocent-0", "container": "app"}
    prometheus.set_targets(
        "operator",
        "lookalike",
        [
            (address_of(real), operator_labels("nvidia-dcgm-exporter-real")),
            (address_of(idle), attacker),
            (address_of(same_gpu), attacker | {"pod": "innocent-1"}),
        ],
    )
    try:
        await eventually(
            lambda: _series_count(prometheus, 'DCGM_FI_DEV_GPU_UTIL{exported_namespace="victim"}', 3),
            timeout=20,
        )
        operators = await make_scaler(prometheus_url=prometheus.url, **THROUGH_PROMETHEUS)
        anywhere = await make_scaler(
            prometheus_url=prometheus.url, exporter_namespaces=None, **THROUGH_PROMETHEUS
        )
        victim = trigger("victim-")
        await _answers(operators, "victim", victim, 90.0)
        # What the look-alikes would do: victim-0 at mean(90, 0), and victim-1 at 100.
        await _answers(anywhere, "victim", victim, 145.0)
    finally:
        prometheus.set_targets("operator", "lookalike", [])


async def _series_count(prometheus: PrometheusServer, promql: str, count: int) -> None:
    assert len(prometheus.query(promql)) == count


@pytest.mark.parametrize(
    "namespace",
    ['we"ird', "back\\slash", "new\nline", "dot.*star", "ünïcode", "close}brace", 'llm",pod!="'],
)
async def test_any_namespace_is_quoted_safely(
    fleet: Fleet, prometheus: PrometheusServer, namespace: str
) -> None:
    settings = Settings(
        prometheus_url=prometheus.url, prometheus_username=USERNAME, prometheus_password=PASSWORD
    )
    async with client_session() as session:
        client = PrometheusClient(session, settings, Telemetry(), time.monotonic)
        # Prometheus parses it and finds nothing: the value was one string, never PromQL (unquoted,
        # 'llm",pod!="' would find the fleet's llm series).
        assert await client.query(namespace_query(namespace, None), time.time(), "namespace") == []


async def _unavailable(scaler: Any, namespace: str, metadata: dict[str, str], *texts: str) -> str:
    async def check() -> str:
        result = await outcome(scaler, namespace, metadata)
        assert isinstance(result, str) and result.startswith("UNAVAILABLE"), result
        for text in texts:
            assert text in result, result
        return result

    return await eventually(check, timeout=20)


FAILURES = {
    "down": ("stop", "Cannot connect"),
    "slow": ("delay", "timed out after 1s"),
    "http-error": (
        (422, b'{"status":"error","errorType":"execution","error":"query would load too many samples"}'),
        "HTTP 422 Unprocessable Entity: execution: query would load too many samples",
    ),
    "error-status": ((200, b'{"status":"error","errorType":"internal","error":"boom"}'), "internal: boom"),
    "not-json": ((200, b"<html>maintenance</html>"), "not JSON"),
    "not-a-vector": (
        (200, b'{"status":"success","data":{"resultType":"scalar","result":[1,"2"]}}'),
        "scalar",
    ),
    "oversized": ((200, b'{"status":"success","pad":"' + b"x" * 300_000 + b'"}'), "answer too large"),
}


@pytest.mark.parametrize("failure", list(FAILURES))
async def test_prometheus_down_slow_or_failing_is_unavailable(
    fleet: Fleet, proxy: PrometheusProxy, make_scaler: Any, failure: str
) -> None:
    scaler = await make_scaler(
        prometheus_url=proxy.url,
        max_page_bytes=100_000,
        **(
            THROUGH_PROMETHEUS
            | {"prometheus_timeout": 1.0, "prometheus_username": None, "prometheus_password": None}
        ),
    )
    await _answers(scaler, "llm", QWEN, 87.0)
    how, text = FAILURES[failure]
    if how == "stop":
        await proxy.stop()
    elif how == "delay":
        proxy.delay = 2.0
    else:
        assert isinstance(how, tuple)
        proxy.answer = how
    # The last good value is used while it is fresh, then never again: UNAVAILABLE, saying why.
    await _unavailable(scaler, "llm", QWEN, "prometheus llm", text)


async def test_is_active_unavailable_too(fleet: Fleet, proxy: PrometheusProxy, make_scaler: Any) -> None:
    scaler = await make_scaler(
        prometheus_url=proxy.url,
        **(THROUGH_PROMETHEUS | {"prometheus_username": None, "prometheus_password": None}),
    )
    ref = pb.ScaledObjectRef(name="so", namespace="llm", scalerMetadata=QWEN)

    async def active() -> None:
        assert (await scaler.stub.IsActive(ref)).result is True

    await eventually(active, timeout=20)
    await proxy.stop()

    async def unavailable() -> None:
        # Not pytest.raises: its failure is no AssertionError, and eventually() would not poll again.
        try:
            result = await scaler.stub.IsActive(ref)
        except grpc.aio.AioRpcError as error:
            assert error.code() is grpc.StatusCode.UNAVAILABLE
        else:
            raise AssertionError(f"answered {result.result} without fresh data")

    await eventually(unavailable, timeout=20)


def _pods(*lines: GpuLine, host: str) -> str:
    return dcgm_page(list(lines), host=host)


async def test_series_with_frozen_timestamps_are_not_used(
    prometheus: PrometheusServer, make_exporter: Any, make_scaler: Any, test_targets: Any
) -> None:
    """Prometheus keeps showing a series with explicit timestamps for 5 minutes after its last sample (no
    staleness marker applies to them); the scaler reads the sample time and stops using it."""
    page = _pods(GpuLine("frozen", "vllm-0", 50), host="node-f")
    exporter = await make_exporter(with_timestamps(page, int(time.time() * 1000)))
    test_targets("direct", exporter)
    scaler = await make_scaler(prometheus_url=prometheus.url, **THROUGH_PROMETHEUS)

    async def refresh() -> None:
        while True:
            exporter.page = with_timestamps(page, int(time.time() * 1000))
            await asyncio.sleep(0.1)

    ticking = asyncio.create_task(refresh())
    try:
        await _answers(scaler, "frozen", trigger("vllm-"), 50.0)
    finally:
        ticking.cancel()
    # The exporter now prints the same old sample time forever; Prometheus still returns the series.
    result = await _unavailable(scaler, "frozen", trigger("vllm-"), "old")
    assert prometheus.query('DCGM_FI_DEV_GPU_UTIL{namespace="frozen"}'), "Prometheus should still show it"
    assert "max staleness 3s" in result


async def _two_nodes(namespace: str, make_exporter: Any, test_targets: Any) -> tuple[Any, Any]:
    """vllm-0 at 50 on node a, vllm-1 at 30 on node b, each exporter a target Prometheus scrapes."""
    a = await make_exporter(_pods(GpuLine(namespace, "vllm-0", 50), host="node-a"))
    b = await make_exporter(_pods(GpuLine(namespace, "vllm-1", 30), host="node-b"))
    test_targets("operator", a, b)
    return a, b


async def test_dead_exporter_pods_count_as_missing(
    prometheus: PrometheusServer, make_exporter: Any, make_scaler: Any, test_targets: Any
) -> None:
    _, b = await _two_nodes("dead", make_exporter, test_targets)
    scaler = await make_scaler(prometheus_url=prometheus.url, **THROUGH_PROMETHEUS)
    await _answers(scaler, "dead", trigger("vllm-"), 80.0)
    await b.stop()
    # vllm-1's series go stale in Prometheus; its pod counts as missing, as the threshold (70): the
    # value cannot shrink to 50 because one exporter died.
    await _answers(scaler, "dead", trigger("vllm-"), 120.0)


async def test_zero_pods_while_a_gpu_exporter_is_down_is_unavailable_after_a_restart(
    prometheus: PrometheusServer, make_exporter: Any, make_scaler: Any, test_targets: Any
) -> None:
    # SPEC §4 without Kubernetes: zero target pods is an answer only while every exporter answers. A
    # scaler started while the exporter of the namespace's only GPU node is down has never seen its pods:
    # Prometheus' `up` 0 for a target of an exporter job says so (0 would let KEDA scale it to zero).
    a = await make_exporter(_pods(GpuLine("elsewhere", "web-0", 10), host="node-a"))
    b = await make_exporter(_pods(GpuLine("restarted", "vllm-0", 50), host="node-b"))
    test_targets("operator", a, b)
    await eventually(
        lambda: _scraped(prometheus, 'DCGM_FI_DEV_GPU_UTIL{exported_namespace="restarted"}'), timeout=20
    )
    b.status = 503  # down: Prometheus' `up` is 0 for it and its series go stale
    await eventually(lambda: _scraped(prometheus, f'up{{instance="{address_of(b)}"}} == 0'), timeout=20)
    scaler = await make_scaler(prometheus_url=prometheus.url, **THROUGH_PROMETHEUS)
    await _unavailable(scaler, "restarted", trigger("vllm-"), "down", address_of(b))
    b.status = 200
    await _answers(scaler, "restarted", trigger("vllm-"), 50.0)


async def test_zero_pods_while_a_whole_exporter_job_is_down_is_unavailable_after_a_restart(
    prometheus: PrometheusServer, make_exporter: Any, make_scaler: Any
) -> None:
    # As above, with every target of the exporter job down (one scrape job per exporter DaemonSet, its
    # only node's exporter failing): no series of that job is current, yet it served GPU series.
    elsewhere = await make_exporter(_pods(GpuLine("elsewhere", "web-0", 10), host="node-other"))
    a = await make_exporter(_pods(GpuLine("whole-job", "vllm-0", 50), host="node-job"))
    job = {"job": "whole-job-dcgm", **operator_labels("dcgm-whole-job")}
    others = (address_of(elsewhere), operator_labels("dcgm-elsewhere"))
    prometheus.set_targets("operator", "whole-job", [(address_of(a), job), others])
    try:
        await eventually(
            lambda: _scraped(prometheus, 'DCGM_FI_DEV_GPU_UTIL{job="whole-job-dcgm"}'), timeout=20
        )
        a.status = 503
        await eventually(lambda: _scraped(prometheus, 'up{job="whole-job-dcgm"} == 0'), timeout=20)
        await eventually(
            lambda: _absent(prometheus, 'DCGM_FI_DEV_GPU_UTIL{job="whole-job-dcgm"}'), timeout=20
        )
        scaler = await make_scaler(prometheus_url=prometheus.url, **THROUGH_PROMETHEUS)
        await _unavailable(scaler, "whole-job", trigger("vllm-"), "down", address_of(a))
        a.status = 200
        await _answers(scaler, "whole-job", trigger("vllm-"), 50.0)
    finally:
        prometheus.set_targets("operator", "whole-job", [])


async def _absent(prometheus: PrometheusServer, query: str) -> None:
    assert not prometheus.query(query), query


async def _scraped(prometheus: PrometheusServer, query: str) -> None:
    assert prometheus.query(query), query


async def _none_down(prometheus: PrometheusServer) -> None:
    assert prometheus.query(down_exporters_query()) == []


async def test_pods_gone_from_live_exporters_are_gone(
    prometheus: PrometheusServer, make_exporter: Any, make_scaler: Any, test_targets: Any
) -> None:
    a = await make_exporter(
        _pods(GpuLine("gone", "vllm-0", 50, gpu=0), GpuLine("gone", "vllm-2", 20, gpu=1), host="node-a")
    )
    b = await make_exporter(
        _pods(GpuLine("gone", "vllm-1", 30, gpu=0), GpuLine("", "", 0, gpu=1), host="node-b")
    )
    test_targets("operator", a, b)
    scaler = await make_scaler(prometheus_url=prometheus.url, **THROUGH_PROMETHEUS)
    await _answers(scaler, "gone", trigger("vllm-"), 100.0)
    # vllm-2 ends on node a (which still runs vllm-0), vllm-1 on node b (whose exporter goes on printing
    # its GPUs, one for another workload's pod): both pods are gone, not missing.
    a.page = _pods(GpuLine("gone", "vllm-0", 50, gpu=0), GpuLine("", "", 0, gpu=1), host="node-a")
    b.page = _pods(GpuLine("batch", "train-0", 90, gpu=0), GpuLine("", "", 0, gpu=1), host="node-b")
    await _answers(scaler, "gone", trigger("vllm-"), 50.0)


async def test_through_prometheus_an_attribution_outage_keeps_the_pod_missing(
    prometheus: PrometheusServer, make_exporter: Any, make_scaler: Any, test_targets: Any
) -> None:
    # SPEC §4: node b's exporter goes on answering with its GPU series, naming no pod at all (dcgm-exporter
    # lost the kubelet's socket): vllm-1 stays a missing pod (the threshold, 70), as when scraped directly.
    # It was forgotten: 50, where 120 is right.
    _, b = await _two_nodes("lost", make_exporter, test_targets)
    scaler = await make_scaler(prometheus_url=prometheus.url, **THROUGH_PROMETHEUS)
    await _answers(scaler, "lost", trigger("vllm-"), 80.0)
    b.page = _pods(GpuLine("", "", 30), host="node-b")
    await _answers(scaler, "lost", trigger("vllm-"), 120.0)


async def test_basic_auth_wrong_password_names_http_401(
    fleet: Fleet, prometheus: PrometheusServer, make_scaler: Any
) -> None:
    scaler = await make_scaler(
        prometheus_url=prometheus.url, **(THROUGH_PROMETHEUS | {"prometheus_password": "not-the-password"})
    )
    await _unavailable(scaler, "llm", QWEN, "HTTP 401 Unauthorized", "--prometheus-username")


async def test_basic_auth_password_file(
    fleet: Fleet, prometheus: PrometheusServer, make_scaler: Any, tmp_path: Path
) -> None:
    password_file = tmp_path / "password"
    password_file.write_text(PASSWORD + "\n")
    scaler = await make_scaler(
        prometheus_url=prometheus.url,
        **(THROUGH_PROMETHEUS | {"prometheus_password": None, "prometheus_password_file": password_file}),
    )
    await _answers(scaler, "llm", QWEN, 87.0)


async def test_bearer_token_file_is_read_again_when_it_changes(
    fleet: Fleet, proxy: PrometheusProxy, make_scaler: Any, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("token-1\n")
    proxy.bearer = "token-1"
    proxy.required_headers = {"X-Scope-OrgID": "team-a"}
    scaler = await make_scaler(
        prometheus_url=proxy.url,
        prometheus_bearer_token_file=token,
        prometheus_headers=(("X-Scope-OrgID", "team-a"),),
        **(THROUGH_PROMETHEUS | {"prometheus_username": None, "prometheus_password": None}),
    )
    await _answers(scaler, "llm", QWEN, 87.0)
    proxy.bearer = "token-2"  # the gateway rotated its token; the sidecar has not caught up yet
    await _unavailable(scaler, "llm", QWEN, "HTTP 401")
    token.write_text("token-2\n")
    await _answers(scaler, "llm", QWEN, 87.0)
    assert proxy.seen_headers[-1]["Authorization"] == "Bearer token-2"
    assert proxy.seen_headers[-1]["X-Scope-OrgID"] == "team-a"


async def test_ca_bundle_and_client_certificate(
    fleet: Fleet, prometheus: PrometheusServer, make_scaler: Any, tmp_path: Path
) -> None:
    ca = CertificateAuthority()
    server_cert, server_key = write(tmp_path, "server", ca.issue("localhost", ["localhost"]))
    client_cert, client_key = write(tmp_path, "client", ca.issue("keda-gpu-scaler", [], client=True))
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(tmp_path / "ca.crt"))
    tls.load_cert_chain(server_cert, server_key)
    tls.verify_mode = ssl.CERT_REQUIRED
    gateway = PrometheusProxy(prometheus.url, tls=tls)
    await gateway.start()
    try:
        url = f"https://localhost:{gateway.port}"
        without_credentials = THROUGH_PROMETHEUS | {"prometheus_username": None, "prometheus_password": None}
        scaler = await make_scaler(
            prometheus_url=url,
            prometheus_ca_file=tmp_path / "ca.crt",
            prometheus_cert_file=client_cert,
            prometheus_key_file=client_key,
            **without_credentials,
        )
        await _answers(scaler, "llm", QWEN, 87.0)
        # Without the client certificate the gateway refuses the handshake.
        refused = await make_scaler(
            prometheus_url=url, prometheus_ca_file=tmp_path / "ca.crt", **without_credentials
        )
        await _unavailable(refused, "llm", QWEN, "prometheus llm")
    finally:
        await gateway.stop()


async def test_serve_with_prometheus_flags_and_password_from_the_environment(
    fleet: Fleet, prometheus: PrometheusServer
) -> None:
    """As an operator runs it: flags, the password only in the environment, no `source` in the trigger."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "keda_gpu_scaler",
        "serve",
        "--grpc-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0",
        "--kubernetes=off",
        f"--prometheus-url={prometheus.url}/",
        f"--prometheus-username={USERNAME}",
        "--scrape-interval=0.5",
        "--max-staleness=3",
        "--prometheus-max-staleness=3",
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "KEDA_GPU_SCALER_PROMETHEUS_PASSWORD": PASSWORD},
    )
    try:
        assert process.stderr is not None
        ready = re.compile(r"serving gRPC on \S+ \(port (\d+)")
        async with asyncio.timeout(20):
            while not (match := ready.search((await process.stderr.readline()).decode())):
                pass
        async with grpc.aio.insecure_channel(f"127.0.0.1:{match.group(1)}") as channel:
            scaler = type("Scaler", (), {"stub": pb_grpc.ExternalScalerStub(channel)})
            await _answers(scaler, "llm", QWEN, 87.0)
    finally:
        process.terminate()
        await process.wait()
