"""Freshness: time from a change at an exporter until the value read by KEDA shows it, scaler vs Prometheus."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import grpc

from bench.harness import PageServer, Section, median, page_server, prometheus, scaler, trigger_ref
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb
from keda_gpu_scaler.externalscaler import externalscaler_pb2_grpc as pb_grpc

POLL_SECONDS = 0.025
Reader = Callable[[], Awaitable[float | None]]


@dataclass(frozen=True)
class Path:
    """One way of reading a value: who collects it, and how often."""

    label: str
    kind: str  # "scaler" or "prometheus"
    interval: float
    note: str


PATHS = (
    Path("scaler, 5 s (default)", "scaler", 5.0, "default"),
    Path("Prometheus, 15 s", "prometheus", 15.0, "default"),
    Path("Prometheus, 30 s", "prometheus", 30.0, "default"),
    Path("Prometheus, 5 s", "prometheus", 5.0, "equal"),
    Path("scaler, 1 s", "scaler", 1.0, "equal"),
    Path("Prometheus, 1 s", "prometheus", 1.0, "equal"),
)


@dataclass
class Lane:
    path: Path
    index: int  # exporter (port) index in the page server; its pods live in namespace lane<index>
    latencies: list[float] = field(default_factory=list)


async def _trials(
    lane: Lane, pages: PageServer, session: aiohttp.ClientSession, read: Reader, until: float
) -> None:
    loop = asyncio.get_running_loop()
    rng = random.Random(lane.index)
    value = 10.0 + lane.index
    while True:
        # A random pause puts each change at a random phase of the collector's schedule.
        await asyncio.sleep(rng.uniform(0, lane.path.interval))
        if loop.time() + 1 > until:
            return
        value = 10.0 + (value + 7) % 80
        changed_at = loop.time()  # taken before the change: a latency is never under-counted
        await pages.set_util(session, lane.index, value)
        while True:
            with contextlib.suppress(grpc.aio.AioRpcError, aiohttp.ClientError):
                if await read() == value:
                    break
            if loop.time() > changed_at + 3 * lane.path.interval + 5:
                lane.latencies.append(float("inf"))  # never seen: counts as the worst case
                return
            await asyncio.sleep(POLL_SECONDS)
        lane.latencies.append(loop.time() - changed_at)


def _scaler_reader(stub: pb_grpc.ExternalScalerStub, lane: Lane) -> Reader:
    request = pb.GetMetricsRequest(
        scaledObjectRef=trigger_ref("bench", f"lane{lane.index}"), metricName="gpu-utilization"
    )

    async def read() -> float | None:
        return float((await stub.GetMetrics(request)).metricValues[0].metricValueFloat)

    return read


async def run(quick: bool = False) -> Section:
    lanes_per_path = 2 if quick else 3
    duration = 25.0 if quick else 125.0
    lanes = [
        Lane(path, i * lanes_per_path + k) for i, path in enumerate(PATHS) for k in range(lanes_per_path)
    ]
    async with (
        page_server(len(lanes), namespace_per_port=True) as pages,
        aiohttp.ClientSession() as session,
        contextlib.AsyncExitStack() as stack,
    ):
        jobs = {
            f"p{int(p.interval)}": (
                p.interval,
                [f"127.0.0.1:{pages.ports[lane.index]}" for lane in lanes if lane.path is p],
            )
            for p in PATHS
            if p.kind == "prometheus"
        }
        prom = await stack.enter_async_context(prometheus(jobs))
        readers: dict[int, Reader] = {}
        for path in PATHS:
            mine = [lane for lane in lanes if lane.path is path]
            if path.kind == "scaler":
                running = await stack.enter_async_context(
                    scaler([pages.url(lane.index) for lane in mine], scrape_interval=f"{path.interval:g}")
                )
                channel = await stack.enter_async_context(grpc.aio.insecure_channel(running.target))
                stub = pb_grpc.ExternalScalerStub(channel)
                for lane in mine:
                    await stub.GetMetricSpec(trigger_ref("bench", f"lane{lane.index}"))
                    readers[lane.index] = _scaler_reader(stub, lane)
            else:
                for lane in mine:
                    expr = f'max(DCGM_FI_DEV_GPU_UTIL{{job="p{int(path.interval)}",namespace="lane{lane.index}"}})'
                    readers[lane.index] = _prometheus_reader(prom.query, session, expr)
        # Let Prometheus pick up its targets (it applies them every 5 s) and every first scrape land.
        await asyncio.sleep(8)
        until = asyncio.get_running_loop().time() + duration
        await asyncio.gather(*(_trials(lane, pages, session, readers[lane.index], until) for lane in lanes))

    rows = []
    headlines: list[tuple[str, str, str, bool | None]] = []
    by_label: dict[str, tuple[float, float]] = {}
    for path in PATHS:
        values = [v for lane in lanes if lane.path is path for v in lane.latencies]
        if not values:
            rows.append(f"| {path.label} | {path.note} | 0 | – | – | – |")
            continue
        worst = max(values)
        by_label[path.label] = (median(values), worst)
        goal = path.interval + 0.2
        verdict = "met" if worst <= goal else "**missed**"
        if path.label.startswith("scaler") or path.note == "default":
            headlines.append(
                (
                    f"Freshness, {path.label}: median / worst",
                    f"{median(values):.2f} s / {worst:.2f} s",
                    f"worst ≤ {goal:.1f} s",
                    worst <= goal,
                )
            )
        rows.append(
            f"| {path.label} | {path.note} | {len(values)} | {median(values):.2f} | {worst:.2f} |"
            f" ≤ {goal:.1f}: {verdict} |"
        )
    table = "\n".join(rows)
    ours, prom15 = by_label.get(PATHS[0].label), by_label.get(PATHS[1].label)
    comparison = ""
    if ours and prom15:
        comparison = (
            f"At the defaults the scaler's worst case ({ours[1]:.2f} s) is"
            f" {'shorter' if ours[1] < prom15[0] else 'not shorter'} than the median of the Prometheus path"
            f" at 15 s ({prom15[0]:.2f} s; dcgm-exporter's ServiceMonitor default, kube-prometheus-stack uses"
            " 30 s). At equal intervals both wait for their next scrape, so they are alike."
        )
    return Section(
        f"""## Freshness

Time from a change of the GPU utilisation on an exporter page until the value KEDA would read shows it:
`GetMetrics` of a `keda-gpu-scaler serve` subprocess, or an instant query
(`max(DCGM_FI_DEV_GPU_UTIL{{…}})` on `/api/v1/query`) of a real Prometheus server — the Prometheus path
of KEDA's `prometheus` trigger. All paths run at once for {duration:g} s, each on its own exporters
({lanes_per_path} per path, each trial changing one at a random phase of the collector's schedule); the
reader polls every {POLL_SECONDS * 1000:g} ms, so each figure may be up to that much late. The clock starts
before the change is sent to the page server. Neither figure includes the exporter's own refresh
(dcgm-exporter: 30 s by default), which both paths wait for alike, nor KEDA's and the HPA's polling.

| path | settings | trials | median s | worst s | goal: worst ≤ interval + 0.2 s |
|---|---|---|---|---|---|
{table}

{comparison}
""",
        headlines,
    )


def _prometheus_reader(
    query: Callable[[aiohttp.ClientSession, str], Awaitable[float | None]],
    session: aiohttp.ClientSession,
    expr: str,
) -> Reader:
    async def read() -> float | None:
        return await query(session, expr)

    return read
