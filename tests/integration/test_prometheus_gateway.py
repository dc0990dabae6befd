"""`metric: pending` with `source: prometheus` (SPEC §7): a real Prometheus scraping loopback EPP pages."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web
from prometheus_support import PASSWORD, USERNAME, PrometheusServer, address_of, basic_auth
from support import ExporterServer, eventually

from keda_gpu_scaler.demo.epp import Queued, epp_page
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb
from keda_gpu_scaler.pages.gateways import epp

pytestmark = pytest.mark.prometheus

# Collection every 0.5 s from a Prometheus scraping every 1 s: data may be up to 3 s old.
INTERVAL, MAX_STALENESS = 0.5, 3.0
PENDING = {"metric": "pending", "threshold": "4", "inferencePool": "chat-pool", "source": "prometheus"}


@pytest.fixture
def targets(prometheus: PrometheusServer) -> Iterator[Any]:
    """Register EPP pages as targets, with the labels Kubernetes pod discovery gives an EPP pod."""

    def register(*servers: tuple[ExporterServer, str, str]) -> None:
        prometheus.set_targets(
            "operator",  # honor_labels false: the target's namespace and pod label the series
            "gateway",
            [(address_of(s), {"namespace": ns, "pod": pod, "container": "epp"}) for s, ns, pod in servers],
        )

    yield register
    prometheus.set_targets("operator", "gateway", [])


@pytest.fixture
async def scaler(make_scaler: Any, prometheus: PrometheusServer) -> Any:
    return await make_scaler(
        prometheus_url=prometheus.url,
        prometheus_username=USERNAME,
        prometheus_password=PASSWORD,
        prometheus_timeout=2.0,
        scrape_interval=INTERVAL,
        max_staleness=MAX_STALENESS,
        prometheus_max_staleness=MAX_STALENESS,
    )


def ref(metadata: dict[str, str] = PENDING) -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name="chat", namespace="llm", scalerMetadata=metadata)


async def value_is(scaler: Any, expected: float, metadata: dict[str, str] = PENDING) -> None:
    async def check() -> None:
        request = pb.GetMetricsRequest(scaledObjectRef=ref(metadata), metricName="gateway-pending")
        try:
            response = await scaler.stub.GetMetrics(request)
        except grpc.aio.AioRpcError as error:
            raise AssertionError(f"{error.code().name}: {error.details()}") from None
        assert response.metricValues[0].metricValueFloat == expected

    await eventually(check, timeout=20)


async def unavailable_saying(scaler: Any, *words: str, metadata: dict[str, str] = PENDING) -> str:
    async def check() -> str:
        try:
            await scaler.stub.IsActive(ref(metadata))
        except grpc.aio.AioRpcError as error:
            assert error.code() is grpc.StatusCode.UNAVAILABLE, error
            message = error.details() or ""
            for word in words:
                assert word in message, message
            return message
        raise AssertionError("IsActive answered")

    return await eventually(check, timeout=20)


async def test_pending_sums_the_pool_s_replicas_of_its_own_namespace(
    scaler: Any, make_exporter: Any, targets: Any
) -> None:
    a = await make_exporter(epp_page("chat-pool", {Queued("llama", "team-a"): 3}))
    # An older EPP, printing the queue under the Inference Extension's name.
    b = await make_exporter(epp_page("chat-pool", {Queued("qwen"): 2}, names=(epp.QUEUE_OLD,)))
    # The same pool name in another namespace, and another pool of this one: never counted.
    other_namespace = await make_exporter(epp_page("chat-pool", {Queued("llama"): 100}))
    other_pool = await make_exporter(epp_page("code-pool", {Queued("coder"): 50}))
    targets(
        (a, "llm", "chat-pool-epp-0"),
        (b, "llm", "chat-pool-epp-1"),
        (other_namespace, "other", "chat-pool-epp-0"),
        (other_pool, "llm", "code-pool-epp-0"),
    )
    await value_is(scaler, 5)
    assert (await scaler.stub.IsActive(ref())).result is True
    await value_is(scaler, 3, {**PENDING, "model": "llama"})


async def test_a_replica_two_scrape_jobs_read_counts_once(
    scaler: Any, make_exporter: Any, targets: Any, prometheus: PrometheusServer
) -> None:
    """A ServiceMonitor and a PodMonitor both scraping one EPP replica: its series are in Prometheus twice,
    differing only by the scrape target's labels (job, service, endpoint). Its queue counts once."""
    a = await make_exporter(epp_page("chat-pool", {Queued("llama", "team-a"): 3}))
    b = await make_exporter(epp_page("chat-pool", {Queued("qwen"): 2}))
    targets((a, "llm", "chat-pool-epp-0"), (b, "llm", "chat-pool-epp-1"))
    service_monitor = {"namespace": "llm", "pod": "chat-pool-epp-0", "container": "epp"}
    service_monitor |= {"service": "chat-pool-epp", "endpoint": "metrics"}
    prometheus.set_targets("direct", "gateway-twice", [(address_of(a), service_monitor)])
    try:

        async def both_jobs() -> None:
            found = prometheus.query('llm_d_epp_flow_control_queue_size{pod="chat-pool-epp-0"}')
            assert {e["metric"]["job"] for e in found} == {"operator", "direct"}, found

        await eventually(both_jobs, timeout=20)
        await value_is(scaler, 5)  # 3 + 2, not 3 + 3 + 2
    finally:
        prometheus.set_targets("direct", "gateway-twice", [])


async def test_no_series_for_the_pool_is_unavailable_naming_it(scaler: Any, targets: Any) -> None:
    targets()
    metadata = {**PENDING, "inferencePool": "idle-pool"}  # a pool no EPP in Prometheus ever served
    await unavailable_saying(scaler, "InferencePool llm/idle-pool", "flowControl", metadata=metadata)


async def test_a_replica_prometheus_cannot_scrape_is_never_read_as_zero(
    scaler: Any, make_exporter: Any, targets: Any
) -> None:
    empty = await make_exporter(epp_page("chat-pool", {}))
    busy = await make_exporter(epp_page("chat-pool", {Queued("llama"): 2}))
    targets((empty, "llm", "chat-pool-epp-0"), (busy, "llm", "chat-pool-epp-1"))
    await value_is(scaler, 2)
    busy.status = 500  # Prometheus' scrapes of it fail (up 0): its 2 requests may still be queued
    await unavailable_saying(scaler, "chat-pool-epp-1", "cannot be read")


async def test_without_source_pending_reads_the_pickers_own_pages_even_where_prometheus_is_the_default(
    make_scaler: Any, make_exporter: Any, prometheus: PrometheusServer
) -> None:
    page = await make_exporter(epp_page("chat-pool", {Queued("llama"): 7}))
    # With --prometheus-url and no --exporter-url, triggers without `source` read Prometheus; a wake from
    # zero must not silently wait for Prometheus' scrapes, so pending keeps reading the pages themselves.
    scaler = await make_scaler(
        prometheus_url=prometheus.url,
        prometheus_username=USERNAME,
        prometheus_password=PASSWORD,
        gateway_urls=(("llm", "chat-pool", page.url),),
        default_source="prometheus",
    )
    metadata = {k: v for k, v in PENDING.items() if k != "source"}
    await value_is(scaler, 7, metadata)
    assert page.requests > 0


async def test_requests_turned_away_between_two_answers_wake_the_workload(
    scaler: Any, make_exporter: Any, targets: Any
) -> None:
    fixtures = Path(__file__).parent.parent / "fixtures" / "gateways"
    before = (fixtures / "llm_d_epp_no_endpoints_before.prom").read_text()
    after = (fixtures / "llm_d_epp_no_endpoints_after.prom").read_text()
    page = await make_exporter(before)
    targets((page, "llm", "chat-pool-epp-0"))
    await value_is(scaler, 0)
    assert (await scaler.stub.IsActive(ref())).result is False
    page.page = after  # 5 turned away, none ever queued

    async def woken() -> None:
        assert (await scaler.stub.IsActive(ref())).result is True

    await eventually(woken, timeout=20, interval=0.01)


class HangingForOneNamespace:
    """A Prometheus API in front of the real one that holds every query naming one namespace until the
    test ends (a tenant whose answers are huge or slow to build), and forwards the others at once."""

    def __init__(self, upstream: str, namespace: str) -> None:
        self.upstream = upstream
        self.namespace = namespace
        self.hanging = 0
        self.release = asyncio.Event()
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(headers={"Authorization": basic_auth()})

        async def query(request: web.Request) -> web.Response:
            form = dict(await request.post())
            if f'"{self.namespace}"' in str(form.get("query", "")):
                self.hanging += 1
                await self.release.wait()
                return web.Response(status=503)
            assert self._session is not None
            async with self._session.post(self.upstream + "/api/v1/query", data=form) as upstream:
                body = await upstream.read()
                return web.Response(status=upstream.status, body=body, content_type="application/json")

        app = web.Application()
        app.router.add_route("*", "/api/v1/query", query)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        self.release.set()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()


@pytest.fixture
async def hanging(prometheus: PrometheusServer) -> AsyncIterator[HangingForOneNamespace]:
    server = HangingForOneNamespace(prometheus.url, "hostile")
    await server.start()
    yield server
    await server.stop()


async def test_a_tenants_hanging_queries_never_hold_another_tenants_back(
    hanging: HangingForOneNamespace, make_scaler: Any, make_exporter: Any, targets: Any
) -> None:
    """Queries are shared fairly between namespaces, as page fetches are: while 12 pools of one tenant
    have queries hanging (more than the client runs at once), another tenant's pool is read and a wake
    there is seen."""
    # `hanging` first: it is torn down after the scaler, whose queries it holds.
    page = await make_exporter(epp_page("chat-pool", {Queued("llama"): 0}))
    targets((page, "llm", "chat-pool-epp-0"))
    scaler = await make_scaler(
        prometheus_url=f"http://127.0.0.1:{hanging.port}",
        prometheus_timeout=60.0,  # the hostile queries hang for the whole test
        scrape_interval=INTERVAL,
        max_staleness=MAX_STALENESS,
        prometheus_max_staleness=MAX_STALENESS,
    )
    for index in range(12):
        hostile = pb.ScaledObjectRef(
            name=f"hostile-{index}",
            namespace="hostile",
            scalerMetadata={**PENDING, "inferencePool": f"p{index}"},
        )
        with pytest.raises(grpc.aio.AioRpcError):
            await scaler.stub.IsActive(hostile)

    async def hostile_hangs() -> None:
        assert hanging.hanging >= 6  # its own slots and its half of the common ones

    await eventually(hostile_hangs)
    await value_is(scaler, 0)
    page.page = epp_page("chat-pool", {Queued("llama"): 7})
    await value_is(scaler, 7)
