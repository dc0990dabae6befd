"""Inference-server series (SPEC §6) through a real Prometheus scraping loopback vLLM and SGLang pages."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_support import (
    PASSWORD,
    USERNAME,
    PrometheusServer,
    address_of,
    with_timestamps,
)
from support import ExporterServer, eventually

from keda_gpu_scaler.collect.http import client_session
from keda_gpu_scaler.collect.page_workers import OFF_LOOP_SERIES
from keda_gpu_scaler.collect.prometheus import PrometheusCollector
from keda_gpu_scaler.collect.prometheus_client import PrometheusClient
from keda_gpu_scaler.collect.prometheus_sources import inference_source, pod_inference_source
from keda_gpu_scaler.collect.store import Store
from keda_gpu_scaler.collect.wanted import WantedSources
from keda_gpu_scaler.config.settings import Settings
from keda_gpu_scaler.core.selectors import DEFAULT_EXPORTER_NAMESPACES
from keda_gpu_scaler.core.snapshot import SourceKind
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb
from keda_gpu_scaler.pages.engines import InferenceMetric, PodSamples, pod_reading, value_for
from keda_gpu_scaler.telemetry import Telemetry

pytestmark = pytest.mark.prometheus

ENGINE_PAGES = Path(__file__).resolve().parents[1] / "fixtures" / "engines"
# Collection every 0.5 s from a Prometheus scraping every 1 s: data may be up to 3 s old.
INTERVAL, MAX_STALENESS = 0.5, 3.0


def page(name: str) -> str:
    return (ENGINE_PAGES / name).read_text()


def with_own_pod_labels(text: str, namespace: str, pod: str) -> str:
    """The page as a metrics proxy in front of the pod prints it: with the pod's namespace/pod labels."""
    return re.sub(r"^([a-z_:]+)\{", rf'\1{{namespace="{namespace}",pod="{pod}",', text, flags=re.MULTILINE)


def pod_labels(namespace: str, pod: str) -> dict[str, str]:
    """The target labels Prometheus' Kubernetes pod discovery gives a scraped pod (after the usual relabeling)."""
    return {"namespace": namespace, "pod": pod, "container": "server"}


@pytest.fixture
def targets(prometheus: PrometheusServer) -> Iterator[Any]:
    """Register a test's servers as targets of the `operator` job (honor_labels false), removed afterwards."""

    def register(*servers: tuple[ExporterServer, dict[str, str]]) -> None:
        prometheus.set_targets("operator", "inference", [(address_of(s), labels) for s, labels in servers])

    yield register
    prometheus.set_targets("operator", "inference", [])


async def prometheus_scaler(make_scaler: Any, prometheus: PrometheusServer) -> Any:
    """A scaler reading the module's Prometheus (with its credentials), at the tests' interval and staleness."""
    return await make_scaler(
        prometheus_url=prometheus.url,
        prometheus_username=USERNAME,
        prometheus_password=PASSWORD,
        prometheus_timeout=2.0,
        scrape_interval=INTERVAL,
        max_staleness=MAX_STALENESS,
        prometheus_max_staleness=MAX_STALENESS,
    )


async def requests_value(scaler: Any, ref: pb.ScaledObjectRef) -> Any:
    """GetMetrics' one metric value for an `inference-requests` trigger; an error fails naming its code."""
    try:
        response = await scaler.stub.GetMetrics(
            pb.GetMetricsRequest(scaledObjectRef=ref, metricName="inference-requests")
        )
    except grpc.aio.AioRpcError as error:
        raise AssertionError(f"{error.code().name}: {error.details()}") from None
    (value,) = response.metricValues
    return value


@pytest.fixture
async def source(prometheus: PrometheusServer) -> AsyncIterator[tuple[PrometheusCollector, Store]]:
    """A collector against the module's Prometheus, and its store: tests call collect_inference_once."""
    settings = Settings(
        prometheus_url=prometheus.url,
        prometheus_username=USERNAME,
        prometheus_password=PASSWORD,
        prometheus_timeout=5.0,
    )
    store = Store()
    async with client_session() as session:
        yield (
            PrometheusCollector(
                client=PrometheusClient(session, settings, Telemetry(), time.monotonic),
                store=store,
                wanted=WantedSources(),
                interval=INTERVAL,
                max_staleness=MAX_STALENESS,
                clock=time.monotonic,
                # The metrics proxy's namespace: its series speak for other namespaces' pods.
                exporter_namespaces=frozenset({*DEFAULT_EXPORTER_NAMESPACES, "gateway"}),
            ),
            store,
        )


def inference_view(source: tuple[PrometheusCollector, Store], namespace: str) -> Any:
    return source[1].view(namespace, time.monotonic(), MAX_STALENESS, SourceKind.PROMETHEUS_INFERENCE)


async def pods_of(source: tuple[PrometheusCollector, Store], namespace: str) -> dict[str, PodSamples]:
    """Collect once, then the fresh PodSamples of the namespace's page, by pod."""
    collector = source[0]
    assert await collector.collect_inference_once(namespace)
    view = inference_view(source, namespace)
    # The namespace's page is fresh (pods left out of it may have failing sources of their own).
    assert not [p for p in view.problems if p.startswith(inference_source(namespace) + ":")]
    pods: list[PodSamples] = list(view.readings)  # type: ignore[arg-type]
    assert all(isinstance(p, PodSamples) and p.namespace == namespace for p in pods)
    return {p.pod: p for p in pods}


def requests(pod: PodSamples) -> float:
    value = value_for(pod_reading(pod.samples), InferenceMetric.REQUESTS)
    assert isinstance(value, float | int), value
    return float(value)


def values(pod: PodSamples) -> dict[tuple[str, str], float]:
    return {(s.name, s.labels.get("engine", "")): s.value for s in pod.samples}


async def test_a_tenants_own_pod_cannot_speak_for_another_namespaces_pods(
    source: tuple[PrometheusCollector, Store], make_exporter: Any, targets: Any, prometheus: PrometheusServer
) -> None:
    """A tenant's own pod (scraped with honor_labels false) printing vLLM series labelled with another
    namespace's pods: they arrive as exported_namespace/exported_pod, which count only from that namespace
    itself or --exporter-namespaces. Read, they added 1,000 requests to llm's real pod and made up a pod."""
    own = await make_exporter(page("vllm_v1.prom"))  # running 12 + waiting 3
    spoof = "".join(
        f'vllm:num_requests_{kind}{{namespace="llm",pod="{pod}",engine="9",model_name="m"}} 500\n'
        for pod in ("vllm-b", "vllm-z")
        for kind in ("running", "waiting")
    )
    attacker = await make_exporter(spoof)
    targets((own, pod_labels("llm", "vllm-b")), (attacker, pod_labels("attacker", "evil-0")))

    async def both_scraped() -> dict[str, PodSamples]:
        assert prometheus.query('vllm:num_requests_running{exported_namespace="llm",namespace="attacker"}')
        pods = await pods_of(source, "llm")
        assert "vllm-b" in pods
        return pods

    pods = await eventually(both_scraped, timeout=30)
    assert sorted(pods) == ["vllm-b"] and requests(pods["vllm-b"]) == 15


async def test_each_pods_series_by_its_kubernetes_labels(
    source: tuple[PrometheusCollector, Store], make_exporter: Any, targets: Any
) -> None:
    dp2 = await make_exporter(page("vllm_dp2.prom"))
    single = await make_exporter(page("vllm_v1.prom"))
    # Behind a metrics proxy that prints the pod's own labels: Prometheus keeps them as exported_*.
    proxied = await make_exporter(with_own_pod_labels(page("vllm_v1.prom"), "llm", "vllm-c"))
    sglang = await make_exporter(page("sglang_single.prom"))
    targets(
        (dp2, pod_labels("llm", "vllm-a")),
        (single, pod_labels("llm", "vllm-b")),
        (proxied, pod_labels("gateway", "metrics-proxy-0")),
        (sglang, pod_labels("serving", "sglang-0")),
    )

    async def llm() -> dict[str, PodSamples]:
        pods = await pods_of(source, "llm")
        assert sorted(pods) == ["vllm-a", "vllm-b", "vllm-c"]
        return pods

    pods = await eventually(llm, timeout=30)
    # Colon names arrive whole, one sample per engine; vLLM's waiting breakdown is not one of the families.
    assert values(pods["vllm-a"]) == {
        ("vllm:num_requests_running", "0"): 30,
        ("vllm:num_requests_running", "1"): 26,
        ("vllm:num_requests_waiting", "0"): 4,
        ("vllm:num_requests_waiting", "1"): 1,
        ("vllm:kv_cache_usage_perc", "0"): 0.9,
        ("vllm:kv_cache_usage_perc", "1"): 0.7,
    }
    assert all(s.labels["model_name"] == "Qwen/Qwen2.5-32B-Instruct" for s in pods["vllm-a"].samples)
    assert {s.name for s in pods["vllm-b"].samples} == {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
    }
    assert (requests(pods["vllm-a"]), requests(pods["vllm-b"]), requests(pods["vllm-c"])) == (61, 15, 15)
    proxied_labels = pods["vllm-c"].samples[0].labels
    assert (proxied_labels["exported_namespace"], proxied_labels["namespace"]) == ("llm", "gateway")
    # Each sample carries its own time, from Prometheus: none in the future, none older than the window.
    now_ms = time.time() * 1000
    for pod in pods.values():
        assert all(
            s.timestamp_ms is not None and now_ms - 5000 < s.timestamp_ms <= now_ms for s in pod.samples
        )

    async def sglang_pod() -> dict[str, PodSamples]:
        pods = await pods_of(source, "serving")
        assert list(pods) == ["sglang-0"]  # its target may be scraped a moment after the others
        return pods

    serving = await eventually(sglang_pod, timeout=30)
    assert requests(serving["sglang-0"]) == 13  # running 11 + waiting 2
    # The proxy's own namespace has no pod of its own there (its series belong to llm/vllm-c).
    assert await pods_of(source, "gateway") == {}
    # A namespace without inference servers: a page without pods, not a failure.
    assert await pods_of(source, "nothing-here") == {}
    store = source[1]
    (state,) = [s for s in store.sources() if s.source == inference_source("llm")]
    assert (state.kind, state.namespace, state.last_error) == (SourceKind.PROMETHEUS_INFERENCE, "llm", None)


async def test_a_stopped_server_leaves_the_page_and_is_a_missing_pod(
    source: tuple[PrometheusCollector, Store], make_exporter: Any, targets: Any
) -> None:
    """Its series go stale in Prometheus: the pod is one without data, never its last numbers; its scrape
    target is still there (`up` 0), so the pod stays a target pod, a missing one."""
    a = await make_exporter(page("vllm_v1.prom"))
    b = await make_exporter(page("vllm_dp2.prom"))
    targets((a, pod_labels("stopping", "vllm-0")), (b, pod_labels("stopping", "vllm-1")))

    async def both() -> None:
        assert sorted(await pods_of(source, "stopping")) == ["vllm-0", "vllm-1"]

    await eventually(both, timeout=30)
    await b.stop()

    async def one() -> None:
        assert sorted(await pods_of(source, "stopping")) == ["vllm-0"]
        view = inference_view(source, "stopping")
        assert list(view.recently_seen) == ["vllm-1"]
        assert "up 0 for operator/" in view.recently_seen["vllm-1"]

    await eventually(one, timeout=30)
    assert (
        inference_view(source, "stopping")
        .pod_problems["vllm-1"]
        .startswith(pod_inference_source("stopping", "vllm-1") + ": its server does not answer")
    )


async def test_series_with_frozen_timestamps_are_left_out(
    prometheus: PrometheusServer,
    source: tuple[PrometheusCollector, Store],
    make_exporter: Any,
    targets: Any,
) -> None:
    """Prometheus shows a series with explicit timestamps for 5 minutes after its last sample: the pod's
    samples are read with their own time and the pod is left out once they are too old."""
    text = page("vllm_v1.prom")
    server = await make_exporter(with_timestamps(text, int(time.time() * 1000)))
    targets((server, pod_labels("frozen", "vllm-0")))

    async def refresh() -> None:
        while True:
            server.page = with_timestamps(text, int(time.time() * 1000))
            await asyncio.sleep(0.1)

    ticking = asyncio.create_task(refresh())
    try:

        async def fresh() -> None:
            assert list(await pods_of(source, "frozen")) == ["vllm-0"]

        await eventually(fresh, timeout=30)
    finally:
        ticking.cancel()

    # The server now prints the same sample time forever; Prometheus still returns the series. The pod
    # is still scraped: a missing pod, not a gone one.
    async def left_out() -> None:
        assert await pods_of(source, "frozen") == {}
        assert "stopped updating" in inference_view(source, "frozen").recently_seen["vllm-0"]

    await eventually(left_out, timeout=30)
    assert prometheus.query('{__name__="vllm:num_requests_running",namespace="frozen"}')


@pytest.mark.parametrize("namespace", ['we"ird', "back\\slash", "new\nline", "dot.*", 'llm",pod!="'])
async def test_any_namespace_is_quoted_safely(
    source: tuple[PrometheusCollector, Store], make_exporter: Any, targets: Any, namespace: str
) -> None:
    server = await make_exporter(page("vllm_v1.prom"))
    targets((server, pod_labels("llm", "vllm-0")))

    async def scraped() -> None:
        assert list(await pods_of(source, "llm")) == ["vllm-0"]

    await eventually(scraped, timeout=30)
    # Prometheus parses the query and finds nothing: the value was one string, never PromQL or a pattern.
    assert await pods_of(source, namespace) == {}


async def test_get_metrics_requests_through_prometheus(
    prometheus: PrometheusServer, make_exporter: Any, make_scaler: Any, targets: Any
) -> None:
    """`metric: requests` with `source: prometheus`: running + waiting, summed over the target's pods."""
    dp2 = await make_exporter(page("vllm_dp2.prom"))  # running 30 + 26, waiting 4 + 1
    single = await make_exporter(page("vllm_v1.prom"))  # running 12, waiting 3
    other = await make_exporter(page("vllm_v1.prom"))  # another workload of the namespace
    targets(
        (dp2, pod_labels("grpc", "vllm-qwen-0")),
        (single, pod_labels("grpc", "vllm-qwen-1")),
        (other, pod_labels("grpc", "embedder-0")),
    )
    scaler = await prometheus_scaler(make_scaler, prometheus)
    metadata = {"metric": "requests", "threshold": "8", "podNamePrefix": "vllm-qwen-", "source": "prometheus"}
    ref = pb.ScaledObjectRef(name="qwen", namespace="grpc", scalerMetadata=metadata)

    async def answered() -> None:
        value = await requests_value(scaler, ref)
        assert (value.metricName, value.metricValueFloat, value.metricValue) == (
            "inference-requests",
            76.0,
            76,
        )

    await eventually(answered, timeout=30)


async def test_underscore_sglang_llamacpp_and_trtllm_serve_through_prometheus(
    prometheus: PrometheusServer,
    source: tuple[PrometheusCollector, Store],
    make_exporter: Any,
    make_scaler: Any,
    targets: Any,
) -> None:
    """The families as Prometheus stores them (`sglang_…` as sgl-router prints them), read as scraped."""
    underscore = await make_exporter(page("sglang_router_underscore.prom"))  # waiting 3 + 1, running 14 + 12
    both = await make_exporter(page("sglang_both_spellings.prom"))  # 2 + 9, each gauge twice, counted once
    llama = await make_exporter(page("llamacpp.prom"))  # deferred 5, processing 3
    serve = await make_exporter(page("trtllm_serve.prom"))  # waiting 4, running 22
    targets(
        (underscore, pod_labels("engines", "chat-0")),
        (both, pod_labels("engines", "chat-1")),
        (llama, pod_labels("engines", "chat-2")),
        (serve, pod_labels("engines", "chat-3")),
    )

    async def all_four() -> dict[str, PodSamples]:
        pods = await pods_of(source, "engines")
        assert sorted(pods) == ["chat-0", "chat-1", "chat-2", "chat-3"]
        return pods

    pods = await eventually(all_four, timeout=30)
    assert {s.name for s in pods["chat-0"].samples} == {
        "sglang_num_running_reqs",
        "sglang_num_queue_reqs",
        "sglang_token_usage",
    }
    assert [requests(pods[f"chat-{index}"]) for index in range(4)] == [30, 11, 8, 26]
    scaler = await prometheus_scaler(make_scaler, prometheus)
    metadata = {"metric": "requests", "threshold": "8", "podNamePrefix": "chat-", "source": "prometheus"}
    ref = pb.ScaledObjectRef(name="chat", namespace="engines", scalerMetadata=metadata)

    async def answered() -> None:
        assert (await requests_value(scaler, ref)).metricValueFloat == 30 + 11 + 8 + 26

    await eventually(answered, timeout=30)


async def test_a_stopped_server_is_a_missing_pod_until_prometheus_drops_its_target(
    prometheus: PrometheusServer, make_exporter: Any, make_scaler: Any, targets: Any
) -> None:
    """Without Kubernetes, a pod whose server stops (Prometheus: `up` 0, its series marked stale) stays a
    target pod, counted as missing (SPEC §4), never the smaller sum of the pods left; once Prometheus no
    longer scrapes it at all (the pod is gone), it stops counting."""
    dp2 = await make_exporter(page("vllm_dp2.prom"))  # requests 61
    single = await make_exporter(page("vllm_v1.prom"))  # requests 15
    a, b = (dp2, pod_labels("missing", "vllm-a")), (single, pod_labels("missing", "vllm-b"))
    targets(a, b)
    scaler = await prometheus_scaler(make_scaler, prometheus)
    # Threshold 100: the reporting pod alone (61) calls for 1 replica of 2, so a missing pod counts as 100.
    metadata = {"metric": "requests", "threshold": "100", "podNamePrefix": "vllm-", "source": "prometheus"}
    ref = pb.ScaledObjectRef(name="llm", namespace="missing", scalerMetadata=metadata)
    seen: list[float] = []

    async def value_is(expected: float) -> None:
        value = await requests_value(scaler, ref)
        seen.append(value.metricValueFloat)
        assert value.metricValueFloat == expected

    await eventually(lambda: value_is(76.0), timeout=30)
    seen.clear()
    await single.stop()

    def up_of_b() -> list[str]:
        return [r["value"][1] for r in prometheus.query('up{namespace="missing",pod="vllm-b"}')]

    async def down() -> None:
        assert up_of_b() == ["0"]

    await eventually(down, timeout=30)
    failing_since = time.monotonic()
    # vllm-b is a missing pod counted as the threshold: 61 + 100.
    await eventually(lambda: value_is(161.0), timeout=30)
    assert 61.0 not in seen  # never the made-up load drop on the way
    # It stays so while Prometheus keeps failing to scrape it: asked on every collection until whatever
    # the scaler last read of vllm-b is older than its staleness limit.
    while time.monotonic() < failing_since + MAX_STALENESS + INTERVAL:
        await value_is(161.0)
        await asyncio.sleep(INTERVAL)

    # Its target goes from Prometheus' service discovery (the pod was deleted): it no longer counts.
    targets(a)

    async def target_gone() -> None:
        assert up_of_b() == []

    await eventually(target_gone, timeout=30)
    await eventually(lambda: value_is(61.0), timeout=30)


async def test_a_server_prometheus_cannot_scrape_since_the_start_is_a_missing_pod(
    prometheus: PrometheusServer, make_exporter: Any, make_scaler: Any, targets: Any
) -> None:
    """Without Kubernetes, a pod whose server has failed Prometheus' scrapes (`up` 0) since before the
    scaler started is named by its scrape target only: it is a missing pod, never a made-up 0 (SPEC §4),
    beside a pod that answers too; once its target is gone (the pod was deleted), it no longer counts."""
    broken = await make_exporter(page("vllm_v1.prom"))
    broken.status = 500
    working = await make_exporter(page("vllm_dp2.prom"))  # requests 61
    targets((broken, pod_labels("down-at-start", "vllm-a")))

    async def down() -> None:
        assert [r["value"][1] for r in prometheus.query('up{namespace="down-at-start"}')] == ["0"]

    await eventually(down, timeout=30)
    scaler = await prometheus_scaler(make_scaler, prometheus)
    metadata = {"metric": "requests", "threshold": "100", "podNamePrefix": "vllm-", "source": "prometheus"}
    ref = pb.ScaledObjectRef(name="llm", namespace="down-at-start", scalerMetadata=metadata)

    async def unavailable() -> None:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await scaler.stub.IsActive(ref)
        assert raised.value.code() is grpc.StatusCode.UNAVAILABLE
        assert "vllm-a" in (raised.value.details() or ""), raised.value.details()

    await eventually(unavailable, timeout=30)
    # Beside a pod that answers: the one that cannot be read counts as the threshold (61 + 100).
    targets((broken, pod_labels("down-at-start", "vllm-a")), (working, pod_labels("down-at-start", "vllm-b")))

    async def value_is(expected: float) -> None:
        assert (await requests_value(scaler, ref)).metricValueFloat == expected

    await eventually(lambda: value_is(161.0), timeout=30)
    targets((working, pod_labels("down-at-start", "vllm-b")))
    await eventually(lambda: value_is(61.0), timeout=30)


async def test_a_down_pod_that_is_no_target_leaves_a_workload_at_zero_at_zero(
    prometheus: PrometheusServer, make_exporter: Any, make_scaler: Any, targets: Any
) -> None:
    """Another pod of the namespace that Prometheus cannot scrape (a cache's exporter, a batch job) is not
    one the trigger reads: a workload with no pod named by its podNamePrefix is scaled to zero, 0 and
    inactive (SPEC §4), whatever that pod does."""
    broken = await make_exporter(page("vllm_v1.prom"))
    broken.status = 500
    targets((broken, pod_labels("unrelated-down", "redis-0")))

    async def down() -> None:
        assert [r["value"][1] for r in prometheus.query('up{namespace="unrelated-down"}')] == ["0"]

    await eventually(down, timeout=30)
    scaler = await prometheus_scaler(make_scaler, prometheus)
    metadata = {"metric": "requests", "threshold": "100", "podNamePrefix": "vllm-", "source": "prometheus"}
    ref = pb.ScaledObjectRef(name="llm", namespace="unrelated-down", scalerMetadata=metadata)

    async def at_zero() -> None:
        assert (await requests_value(scaler, ref)).metricValueFloat == 0.0
        assert (await scaler.stub.IsActive(ref)).result is False

    await eventually(at_zero, timeout=30)


async def test_a_large_answer_is_worked_through_off_the_event_loop(
    source: tuple[PrometheusCollector, Store],
    make_exporter: Any,
    targets: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tenant's pods choose how many series an answer holds: stamped and grouped on the loop, 19,000 of
    them held every tenant's RPCs 0.3 s a collection round. Past OFF_LOOP_SERIES it runs in a page worker,
    as a scraped page over 16 kB is read."""
    import threading

    from keda_gpu_scaler.collect import prometheus as collector_module

    threads: dict[str, set[str]] = {}  # where each ran on a large answer

    def recorded(name: str, real: Any) -> Any:
        def recording(*args: Any) -> Any:
            if len(args[0]) > OFF_LOOP_SERIES:
                threads.setdefault(name, set()).add(threading.current_thread().name)
            return real(*args)

        return recording

    for name in ("samples_with_times", "inference_pods", "up_series"):
        monkeypatch.setattr(collector_module, name, recorded(name, getattr(collector_module, name)))
    many = 2000
    lines = [f'vllm:num_requests_waiting{{engine="0",model_name="m{i}"}} 1\n' for i in range(many)]
    page_of_many = "".join(lines) + 'vllm:num_requests_running{engine="0",model_name="m0"} 1\n'
    targets((await make_exporter(page_of_many), pod_labels("many", "vllm-0")))

    async def read() -> None:
        pods = await pods_of(source, "many")
        assert "vllm-0" in pods and requests(pods["vllm-0"]) == many + 1

    await eventually(read, timeout=30)
    assert set(threads) == {"samples_with_times", "inference_pods", "up_series"}
    assert threading.main_thread().name not in set().union(*threads.values()), threads
