"""Collectors share their capacity fairly between namespaces, through the real scaler and real pages:
a healthy tenant's endpoint-picker page is fetched while 300 replicas of another tenant hang."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from aiohttp import web
from support import eventually

from keda_gpu_scaler.demo.epp import Queued, epp_page
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb

HANGING = 300
CONCURRENCY = 8


class HangingPages:
    """One loopback server whose every page hangs until the test ends (counted as they arrive)."""

    def __init__(self) -> None:
        self.hanging = 0
        self.answered = 0
        self.release = asyncio.Event()
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        async def page(_: web.Request) -> web.Response:
            self.hanging += 1
            await self.release.wait()
            self.answered += 1
            return web.Response(text="")

        app = web.Application()
        app.router.add_get("/{replica}/metrics", page)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        self.release.set()
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture
async def hanging() -> AsyncIterator[HangingPages]:
    server = HangingPages()
    await server.start()
    yield server
    await server.stop()


def pending(namespace: str, pool: str) -> pb.ScaledObjectRef:
    metadata = {"metric": "pending", "threshold": "4", "inferencePool": pool}
    return pb.ScaledObjectRef(name="wake", namespace=namespace, scalerMetadata=metadata)


async def test_a_healthy_tenants_page_is_fetched_while_300_replicas_of_another_hang(
    hanging: HangingPages, make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    # `hanging` first: it is torn down after the scaler, whose fetches it holds.
    healthy = await make_exporter(epp_page("chat-pool", {Queued("llama"): 0}))
    hostile = tuple(
        ("hostile", "big-pool", f"http://127.0.0.1:{hanging.port}/r{i}/metrics") for i in range(HANGING)
    )
    scaler = await make_scaler(
        gateway_urls=(*hostile, ("llm", "chat-pool", healthy.url)),
        scrape_concurrency=CONCURRENCY,
        scrape_timeout=60.0,  # the hostile fetches hang for the whole test
    )
    # The hostile pool is read first: its replicas take every slot they may have and hang.
    with pytest.raises(grpc.aio.AioRpcError):
        await scaler.stub.IsActive(pending("hostile", "big-pool"))

    async def hostile_hangs() -> None:
        assert hanging.hanging >= CONCURRENCY  # alone, it took the whole common pool

    await eventually(hostile_hangs)
    request = pb.GetMetricsRequest(scaledObjectRef=pending("llm", "chat-pool"), metricName="gateway-pending")

    async def healthy_reads(expected: float) -> None:
        response = await scaler.stub.GetMetrics(request)
        assert response.metricValues[0].metricValueFloat == expected

    await eventually(lambda: healthy_reads(0))
    # A wake: requests queue at the healthy tenant's gateway and are read while the others still hang.
    healthy.page = epp_page("chat-pool", {Queued("llama"): 7})
    await eventually(lambda: healthy_reads(7))
    assert hanging.answered == 0
