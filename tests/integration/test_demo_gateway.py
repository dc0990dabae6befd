"""The demo's inference gateway: an endpoint picker whose queue `/load?pool=…&pending=N` fills, in front
of a model server at zero replicas; the demo scaler wakes it and the status line says so."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import pytest
from conftest import FAST
from support import eventually

from keda_gpu_scaler.app import App
from keda_gpu_scaler.demo.fleet import DemoFleet
from keda_gpu_scaler.demo.runner import PENDING_METRIC_NAME, banner, demo_settings, pending_metadata, watch
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb
from keda_gpu_scaler.externalscaler import externalscaler_pb2_grpc as pb_grpc
from keda_gpu_scaler.pages.gateways import PoolQueue, page_queue, read_queue

# The tests' fast scaler, with /explain off as the demo serves it.
DEMO_SCALER = dataclasses.replace(FAST, explain=False)


@pytest.fixture
async def fleet() -> AsyncIterator[DemoFleet]:
    fleet = DemoFleet(seed=7, engine_start_s=0.0)
    await fleet.start()
    try:
        yield fleet
    finally:
        await fleet.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


async def load(http: aiohttp.ClientSession, fleet: DemoFleet, **query: str) -> tuple[int, Any]:
    async with http.get(f"{fleet.control_url}/load", params=query) as response:
        return response.status, await response.json()


async def queue_on_pages(http: aiohttp.ClientSession, fleet: DemoFleet) -> list[float]:
    found = []
    for _, pool, url in fleet.gateway_urls:
        async with http.get(url) as response:
            assert response.status == 200
            table = page_queue(await response.read())
        reading = read_queue(table, pool, fleet.NAMESPACE, None)
        assert isinstance(reading, PoolQueue), reading
        found.append(reading.total)
    return found


async def test_load_queues_requests_spread_over_the_endpoint_pickers(
    http: aiohttp.ClientSession, fleet: DemoFleet
) -> None:
    pool = fleet.gateway.pools[0]
    assert len(fleet.gateway_urls) == len(pool.epp_replicas) == 2
    assert await queue_on_pages(http, fleet) == [0, 0]  # flow control on, nothing queued yet
    status, body = await load(http, fleet, pool=pool.name, pending="5")
    assert status == 200, body
    assert body["changed"] == {"pool": pool.name, "pending": 5}
    assert body["gateways"][0]["replicas"] == 0
    assert await queue_on_pages(http, fleet) == [3, 2]
    assert (await load(http, fleet, pool=pool.name, pending="0"))[0] == 200
    assert await queue_on_pages(http, fleet) == [0, 0]


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ({"pool": "nope", "pending": "1"}, "'pool'='nope' is unknown"),
        ({"pool": "chat-zero-pool"}, "missing query parameter 'pending'"),
        ({"pool": "chat-zero-pool", "pending": "two"}, "not a whole number"),
        ({"pool": "chat-zero-pool", "pending": "-1"}, "out of range"),
        ({"pool": "chat-zero-pool", "pending": "99999"}, "out of range"),
        ({"pool": "chat-zero-pool", "pending": "1", "value": "3"}, "'value' does not apply to a pool"),
        ({"pending": "1"}, "'pool'='' is unknown"),
    ],
)
async def test_bad_gateway_loads_are_clear_errors(
    http: aiohttp.ClientSession, fleet: DemoFleet, query: dict[str, str], words: str
) -> None:
    status, body = await load(http, fleet, **query)
    assert status == 400 and words in body["error"], body


async def test_banner_shows_the_wake(fleet: DemoFleet) -> None:
    text = banner(fleet, 6000, 8080)
    assert '"metric":"pending"' in text and '"inferencePool":"chat-zero-pool"' in text
    assert "ExternalScaler/StreamIsActive" in text
    assert f"{fleet.control_url}/load?pool=chat-zero-pool&pending=3" in text


async def test_the_demo_wakes_the_pool_at_zero_and_the_status_line_says_so(
    http: aiohttp.ClientSession, fleet: DemoFleet
) -> None:
    app = App(demo_settings(DEMO_SCALER, fleet))
    await app.start()
    out = io.StringIO()
    task = asyncio.create_task(watch(app, fleet, 0.05, out))
    pool = fleet.gateway.pools[0]
    try:

        async def at_zero() -> None:
            assert any(
                re.match(rf"{pool.workload} +pending +value +0\.0 +active false .*at zero", line)
                for line in out.getvalue().splitlines()
            ), out.getvalue()[-2000:]

        await eventually(at_zero)
        assert (await load(http, fleet, pool=pool.name, pending="3"))[0] == 200

        async def woken() -> None:
            assert any(
                re.match(
                    rf"{pool.workload} +pending +value +3\.0 +active true .*StreamIsActive sent true", line
                )
                for line in out.getvalue().splitlines()
            ), out.getvalue()[-2000:]

        await eventually(woken)
        ref = pb.ScaledObjectRef(
            name=pool.workload, namespace=fleet.NAMESPACE, scalerMetadata=pending_metadata(pool)
        )
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
            stub = pb_grpc.ExternalScalerStub(channel)
            answer = await stub.GetMetrics(
                pb.GetMetricsRequest(scaledObjectRef=ref, metricName=PENDING_METRIC_NAME)
            )
            assert answer.metricValues[0].metricValueFloat == 3
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await app.stop()
