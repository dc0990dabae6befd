"""The hostile soak's tenant neighbours (bench.soak_hostile): what one tenant may try against another.

- 300 endpoint-picker (EPP) replicas of one pool (`hostile-gw/hang-pool`) that accept the connection and
  never answer: every fetch lasts the scrape timeout;
- a ~16 MB EPP page (`hostile-fat/fat-pool`), different on every scrape;
- one ScaledObject calling GetMetricSpec with 2,000 distinct `inferencePool` names;
- an /explain hammer: 8 clients asking again and again, in their own process.

Beside them, the healthy tenant's `pending` trigger (`llm/wake` on `llm/chat-pool`, whose EPP page this
process serves): its queue goes 0 → 5 every few seconds and the wake is timed (until IsActive says true).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import grpc
from aiohttp import web

from bench.harness import percentile
from keda_gpu_scaler.demo.epp import Queued, epp_page
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb
from keda_gpu_scaler.externalscaler import externalscaler_pb2_grpc as pb_grpc

HANGING_REPLICAS = 300
POOL_NAMES = 2000
EXPLAIN_CLIENTS = 8
FAT_SERIES = 19_000  # under the 20,000 series one page may give: read whole on every scrape
FAT_LABEL = 700  # characters of each series' fairness id: ~16 MB in all, under --max-page-bytes (16 MiB)
WAKE_QUEUE = 5
WAKE_POLL = 0.02
HEALTHY_POOL = ("llm", "chat-pool")
WAKE = pb.ScaledObjectRef(
    name="wake",
    namespace="llm",
    scalerMetadata={"metric": "pending", "threshold": "4", "inferencePool": "chat-pool"},
)
HANG = pb.ScaledObjectRef(
    name="hang",
    namespace="hostile-gw",
    scalerMetadata={"metric": "pending", "threshold": "4", "inferencePool": "hang-pool"},
)
FAT = pb.ScaledObjectRef(
    name="fat",
    namespace="hostile-fat",
    scalerMetadata={"metric": "pending", "threshold": "4", "inferencePool": "fat-pool"},
)


def fat_page() -> tuple[bytes, bytes]:
    """(everything before the first queue value, everything after it) of a ~16 MB EPP page."""
    queue = {Queued("llama", fairness_id=f"{i:06d}-" + "f" * FAT_LABEL): 1.0 for i in range(FAT_SERIES)}
    text = epp_page("fat-pool", queue, ready_endpoints=1).encode()
    marker = b'fairness_id="000000-'
    value_at = text.index(b"} ", text.index(marker)) + 2
    line_end = text.index(b"\n", value_at)
    return text[:value_at], text[line_end:]


async def serve_tenant_neighbours(
    counts: Counter[str],
) -> tuple[dict[str, int], dict[str, int], Callable[[], Awaitable[None]]]:
    """Start the hanging replicas and the fat EPP page: their ports, the page's size, how to stop them."""
    head, tail = fat_page()
    sizes = {"fat_epp_bytes": len(head) + len(tail) + 3}

    async def hanging(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        counts["hanging"] += 1
        # Never answers: reads until the scaler gives up and closes (its scrape timeout).
        with contextlib.suppress(OSError, ConnectionError):
            while await reader.read(4096):
                pass
        writer.close()

    async def fat(_: web.Request) -> web.Response:
        counts["fat_epp"] += 1
        # A different first value on every scrape: the page's digest changes, so it is read every time.
        return web.Response(
            body=head + str(counts["fat_epp"] % 100).encode() + tail, content_type="text/plain"
        )

    server = await asyncio.start_server(hanging, "127.0.0.1", 0)
    app = web.Application()
    app.router.add_get("/metrics", fat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()

    async def stop() -> None:
        server.close()
        await runner.cleanup()

    return {"hanging": server.sockets[0].getsockname()[1], "fat_epp": runner.addresses[0][1]}, sizes, stop


def gateway_urls(ports: dict[str, int], healthy_port: int, hostile: bool) -> str:
    """KEDA_GPU_SCALER_GATEWAY_URL for the scaler: the healthy EPP, and with `hostile` the 300 hanging
    replicas and the fat page."""
    healthy = f"{HEALTHY_POOL[0]}/{HEALTHY_POOL[1]}=http://127.0.0.1:{healthy_port}/metrics"
    if not hostile:
        return healthy
    hanging = [
        f"hostile-gw/hang-pool=http://127.0.0.1:{ports['hanging']}/r{i}/metrics"
        for i in range(HANGING_REPLICAS)
    ]
    return ",".join([*hanging, f"hostile-fat/fat-pool=http://127.0.0.1:{ports['fat_epp']}/metrics", healthy])


class HealthyGateway:
    """The healthy tenant's EPP page, served by the measuring process: its queue is set at will."""

    def __init__(self) -> None:
        self.queued = 0.0
        self.port = 0
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        async def page(_: web.Request) -> web.Response:
            text = epp_page(HEALTHY_POOL[1], {Queued("llama"): self.queued}, ready_endpoints=1)
            return web.Response(text=text, content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", page)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


async def keep_hostile_pools_wanted(stub: pb_grpc.ExternalScalerStub) -> None:
    """Call about the hostile pools as KEDA would, so that their pages are fetched (never counted)."""
    while True:
        for ref in (HANG, FAT):
            with contextlib.suppress(grpc.aio.AioRpcError):
                await stub.IsActive(ref, timeout=30)
        await asyncio.sleep(2)


async def many_pool_names(stub: pb_grpc.ExternalScalerStub, seconds: float, result: dict[str, Any]) -> None:
    """One ScaledObject calling GetMetricSpec with POOL_NAMES distinct inferencePool names, spread over
    `seconds`."""
    codes: Counter[str] = Counter()
    result["pool_names"] = codes
    for i in range(POOL_NAMES):
        metadata = {"metric": "pending", "threshold": "4", "inferencePool": f"pool-{i}"}
        ref = pb.ScaledObjectRef(name="many-pools", namespace="hostile-pools", scalerMetadata=metadata)
        try:
            await stub.GetMetricSpec(ref, timeout=10)
            codes["OK"] += 1
        except grpc.aio.AioRpcError as error:
            codes[error.code().name] += 1
        await asyncio.sleep(seconds / POOL_NAMES)


async def measure_wakes(
    stub: pb_grpc.ExternalScalerStub, gateway: HealthyGateway, phase: Callable[[], str], wakes: dict[str, Any]
) -> None:
    """Queue requests at the healthy gateway, time until IsActive says true; empty it, wait for false."""
    codes: Counter[str] = Counter()
    wakes["codes"] = codes

    async def active() -> bool | None:
        try:
            answer = (await stub.IsActive(WAKE, timeout=10)).result
            codes[f"{phase()} OK"] += 1
            return bool(answer)
        except grpc.aio.AioRpcError as error:
            codes[f"{phase()} {error.code().name}"] += 1
            wakes.setdefault("error", (error.details() or "")[:240])
            return None

    async def until(wanted: bool) -> None:
        # Polled as KEDA would poll it, only faster: the wake is timed to the poll that first says so.
        for _ in range(int(15 / WAKE_POLL)):
            if await active() is wanted:
                return
            await asyncio.sleep(WAKE_POLL)

    while True:
        gateway.queued = 0
        await until(False)
        await asyncio.sleep(1.0)
        gateway.queued = WAKE_QUEUE
        started = time.monotonic()
        name = phase()
        await until(True)
        wakes.setdefault(name, []).append(time.monotonic() - started)
        await asyncio.sleep(0.5)


def tenant_setup(fat_bytes: int) -> str:
    """The report's words for the tenants' neighbours present from the start."""
    return (
        f" Hostile tenants: {HANGING_REPLICAS} endpoint-picker replicas of `hostile-gw/hang-pool` that accept"
        f" the connection and never answer, a {fat_bytes / 1e6:.1f} MB endpoint-picker page of"
        f" {FAT_SERIES:,} queue series changing on every scrape (`hostile-fat/fat-pool`), both read by a"
        " `pending` trigger called every 2 s; beside them the healthy tenant's `llm/wake` (`pending` on"
        f" `llm/chat-pool`, its queue 0 → {WAKE_QUEUE} every few seconds, IsActive polled every"
        f" {1000 * WAKE_POLL:g} ms until true)."
    )


# The report's words for the tenants' later neighbours (ending the sentence about the attack).
TENANT_ATTACK = (
    f"; one ScaledObject calling GetMetricSpec with {POOL_NAMES:,} distinct `inferencePool` names, and"
    f" {EXPLAIN_CLIENTS} /explain clients asking without pause (own process)."
)


def wake_stats(values: list[float]) -> str:
    if not values:
        return "no wakes"
    return f"{len(values)} wakes, p50 {percentile(values, 50):.2f} s, max {max(values):.2f} s"


def tenant_rows(r: dict[str, Any], calm_head: float) -> list[str]:
    """The report's rows about the tenants' neighbours and the healthy tenant's wake."""
    wakes = r.get("wakes", {})
    every = wakes.get("calm", []) + wakes.get("attacked", [])
    worst = max(every, default=float("inf"))
    codes = wakes.get("codes", {})
    not_ok = {k: n for k, n in codes.items() if not k.endswith(" OK")}
    error = f"; `{wakes['error']}`" if "error" in wakes else ""
    goal = "met" if worst <= 1.2 else f"missed ({worst:.2f} s)"
    return [
        f"| healthy `pending` wake (queue 0 → {WAKE_QUEUE} until IsActive true), hostile exporters and tenants"
        f" only (first {calm_head:g} s) | {wake_stats(wakes.get('calm', []))} | |",
        f"| healthy `pending` wake under the whole attack | {wake_stats(wakes.get('attacked', []))} |"
        f" ≤ 1.2 s: {goal} |",
        f"| healthy `pending` answers other than OK | {not_ok or 'none'}{error} | |",
        f"| {POOL_NAMES:,} pool names (GetMetricSpec of one ScaledObject) | {dict(r.get('pool_names', {}))} | |",
        f"| /explain hammer ({EXPLAIN_CLIENTS} clients) | {r.get('explain_hammer')} | 429 over the limit |",
    ]


# ---------------------------------------------------------------- the /explain hammer (own process)


async def explain_hammer(url: str, seconds: float) -> None:
    """EXPLAIN_CLIENTS clients asking /explain (the healthy ScaledObject, and the list) without pause."""
    statuses: Counter[str] = Counter()
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession() as session:

        async def client(index: int) -> None:
            params = {"namespace": "llm", "name": "healthy"} if index % 2 else {}
            while time.monotonic() < deadline:
                try:
                    async with session.get(f"{url}/explain", params=params) as response:
                        await response.read()
                        statuses[str(response.status)] += 1
                except aiohttp.ClientError as error:
                    statuses[type(error).__name__] += 1

        await asyncio.gather(*(client(i) for i in range(EXPLAIN_CLIENTS)))
    print(json.dumps(dict(statuses)), flush=True)
