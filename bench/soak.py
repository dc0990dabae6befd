"""Soak: many StreamIsActive streams plus KEDA-style polling for minutes while exporters flap.

Checks what must hold however long the scaler runs: RSS stays bounded, no stream gets stuck, every
idle → busy transition is pushed exactly once per stream, and every stream ends with OK on SIGTERM.
Writes docs/SOAK.md. Run: `make soak` (10 minutes, 1,000 streams) or
`python -m bench.soak --minutes 1 --streams 200` for a short look.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import platform
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from aiohttp import web

from bench.harness import ROOT, rss_mib, scaler
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb
from keda_gpu_scaler.externalscaler import externalscaler_pb2_grpc as pb_grpc

EXPORTERS = 10
WORKLOADS_PER_EXPORTER = 10
PODS_PER_WORKLOAD = 2
# Each workload alternates busy/idle phases of this length; phases are much longer than the scrape
# interval so that every transition is observable, and offset per workload so they do not all flip at once.
PHASE_SECONDS = 20.0
SCRAPE_INTERVAL = 1.0
FLAP_EVERY_SECONDS = 45.0  # an exporter fails for a while this often
FLAP_SECONDS = 6.0  # longer than max staleness (3 s): its triggers go UNAVAILABLE, then recover
QUIET_HEAD = 10.0
QUIET_TAIL = 30.0


@dataclass
class Workload:
    exporter: int
    index: int
    offset: float

    @property
    def name(self) -> str:
        return f"w{self.exporter}-{self.index}"

    @property
    def namespace(self) -> str:
        return f"team-{self.exporter % 5}"

    def busy(self, t: float) -> bool:
        return int((t + self.offset) // PHASE_SECONDS) % 2 == 0

    def activations(self, start: float, end: float) -> int:
        """Idle → busy transitions in (start, end], plus one if busy at start (the stream's first true)."""
        count = 1 if self.busy(start) else 0
        boundary = (int((start + self.offset) // PHASE_SECONDS) + 1) * PHASE_SECONDS - self.offset
        while boundary <= end:
            if self.busy(boundary + 1e-6) and not self.busy(boundary - 1e-6):
                count += 1
            boundary += PHASE_SECONDS
        return count

    def ref(self) -> pb.ScaledObjectRef:
        metadata = {"podNamePrefix": f"{self.name}-", "threshold": "60", "activationThreshold": "5"}
        return pb.ScaledObjectRef(name=self.name, namespace=self.namespace, scalerMetadata=metadata)


@dataclass
class FlappingExporters:
    workloads: list[Workload]
    t0: float
    flap_offsets: list[float]
    quiet_after: float
    runners: list[web.AppRunner] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    failures_served: int = 0

    def page(self, exporter: int, t: float) -> str:
        lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
        gpu = 0
        for workload in (w for w in self.workloads if w.exporter == exporter):
            util = 55 if workload.busy(t) else 0
            for pod in range(PODS_PER_WORKLOAD):
                lines.append(
                    f'DCGM_FI_DEV_GPU_UTIL{{gpu="{gpu}",UUID="GPU-{exporter}-{gpu}",Hostname="node-{exporter}",'
                    f'container="main",namespace="{workload.namespace}",pod="{workload.name}-{pod}"}} {util}'
                )
                gpu += 1
        return "\n".join(lines) + "\n"

    def failing(self, exporter: int, t: float) -> bool:
        # The first seconds are calm so every stream sees its workload's first state; the last are calm so a transition hidden by an outage (and the backoff
        # after it) is pushed before the run ends rather than miscounted as missing.
        if t > self.quiet_after or t < QUIET_HEAD:
            return False
        return (t + self.flap_offsets[exporter]) % FLAP_EVERY_SECONDS < FLAP_SECONDS

    async def start(self) -> None:
        for exporter in range(EXPORTERS):

            async def metrics(_: web.Request, exporter: int = exporter) -> web.Response:
                t = time.monotonic() - self.t0
                if self.failing(exporter, t):
                    self.failures_served += 1
                    return web.Response(status=503, text="flapping")
                return web.Response(text=self.page(exporter, t))

            app = web.Application()
            app.router.add_get("/metrics", metrics)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            self.runners.append(runner)
            self.ports.append(runner.addresses[0][1])

    async def stop(self) -> None:
        for runner in self.runners:
            await runner.cleanup()


async def run(minutes: float, streams: int) -> str:
    rng = random.Random(7)
    workloads = [
        Workload(e, i, rng.uniform(0, 2 * PHASE_SECONDS))
        for e in range(EXPORTERS)
        for i in range(WORKLOADS_PER_EXPORTER)
    ]
    t0 = time.monotonic()
    offsets = [rng.uniform(0, FLAP_EVERY_SECONDS) for _ in range(EXPORTERS)]
    fleet = FlappingExporters(workloads, t0, offsets, quiet_after=minutes * 60 - QUIET_TAIL)
    await fleet.start()
    urls = [f"http://127.0.0.1:{port}/metrics" for port in fleet.ports]
    received: list[int] = [0] * streams
    endings: Counter[str] = Counter()
    polls: Counter[str] = Counter()
    rss: list[tuple[float, float]] = []
    try:
        async with scaler(
            urls, scrape_interval=str(SCRAPE_INTERVAL), max_streams=str(streams + 10)
        ) as server:
            channel = grpc.aio.insecure_channel(server.target)
            stub = pb_grpc.ExternalScalerStub(channel)
            for workload in workloads:
                await stub.GetMetricSpec(workload.ref())
            opened_at = [0.0] * streams

            async def follow(index: int) -> None:
                workload = workloads[index % len(workloads)]
                opened_at[index] = time.monotonic() - t0
                call = stub.StreamIsActive(workload.ref())
                try:
                    async for message in call:
                        assert message.result, "the scaler sent false"
                        received[index] += 1
                    endings[(await call.code()).name] += 1
                except grpc.aio.AioRpcError as error:
                    endings[error.code().name] += 1

            async def poll() -> None:
                while True:
                    for workload in workloads:
                        request = pb.GetMetricsRequest(
                            scaledObjectRef=workload.ref(), metricName="gpu-utilization"
                        )
                        try:
                            await stub.GetMetrics(request)
                            await stub.IsActive(workload.ref())
                            polls["ok"] += 1
                        except grpc.aio.AioRpcError as error:
                            polls[error.code().name] += 1
                    await asyncio.sleep(2)

            followers = [asyncio.create_task(follow(i)) for i in range(streams)]
            poller = asyncio.create_task(poll())
            deadline = t0 + minutes * 60
            # Transitions in the last 3 s may not be pushed yet: the check below allows for them.
            while time.monotonic() < deadline:
                rss.append((time.monotonic() - t0, rss_mib(server.child.pid)[0]))
                await asyncio.sleep(min(10.0, max(0.0, deadline - time.monotonic())))
            ended_at = time.monotonic() - t0
            poller.cancel()
            await server.child.stop(grace=30)
            await asyncio.wait_for(asyncio.gather(*followers, return_exceptions=True), 30)
            await channel.close()
    finally:
        await fleet.stop()

    exact = 0
    mismatches: list[str] = []
    for index in range(streams):
        workload = workloads[index % len(workloads)]
        # A phase change within a few scrapes of the stream's opening or the run's end may or may not be
        # seen; anything outside [low, high] is a missed or repeated push.
        settle = 3 * SCRAPE_INTERVAL
        expected_low = workload.activations(opened_at[index] + settle, ended_at - settle)
        expected_high = workload.activations(opened_at[index], ended_at)
        if expected_low <= received[index] <= expected_high:
            exact += 1
        elif len(mismatches) < 10:
            mismatches.append(
                f"stream {index} ({workload.name}): {received[index]} pushes, expected {expected_low}"
            )
    warm = [value for at, value in rss if at >= 60] or [value for _, value in rss]
    growth = max(warm) - min(warm)
    lines = [
        "# Soak: streams, polling and flapping exporters",
        "",
        f"Date: {datetime.date.today().isoformat()}. Machine: {platform.machine()}, Python {platform.python_version()}.",
        f"Command: `python -m bench.soak --minutes {minutes:g} --streams {streams}` (`make soak`).",
        "",
        f"Setup: {EXPORTERS} loopback exporters × {WORKLOADS_PER_EXPORTER} workloads × {PODS_PER_WORKLOAD} pods;"
        f" each workload alternates busy/idle every {PHASE_SECONDS:g} s; each exporter answers 503 for"
        f" {FLAP_SECONDS:g} s every {FLAP_EVERY_SECONDS:g} s (not in the first {QUIET_HEAD:g} s nor the last"
        f" {QUIET_TAIL:g} s); scrape interval {SCRAPE_INTERVAL:g} s;"
        f" {streams} StreamIsActive streams ({streams // len(workloads)} per workload) and GetMetrics + IsActive"
        " for every workload every 2 s; SIGTERM at the end.",
        "",
        "| check | result |",
        "|---|---|",
        f"| run length | {ended_at:.0f} s |",
        f"| streams whose pushes equal their idle → busy transitions | {exact} of {streams} |",
        f"| stream endings on SIGTERM | {dict(endings)} |",
        f"| polls (GetMetrics + IsActive) | {dict(polls)} |",
        f"| flapping answers served (503) | {fleet.failures_served} |",
        f"| RSS first / last / max (MiB) | {rss[0][1]:.1f} / {rss[-1][1]:.1f} / {max(v for _, v in rss):.1f} |",
        f"| RSS growth after the first minute | {growth:.1f} MiB |",
    ]
    if mismatches:
        lines += ["", "Mismatched streams (first 10):", "", *(f"- {m}" for m in mismatches)]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--output", type=Path, default=ROOT / "docs" / "SOAK.md")
    args = parser.parse_args()
    report = asyncio.run(run(args.minutes, args.streams))
    print(report)
    with contextlib.suppress(OSError):
        args.output.write_text(report)


if __name__ == "__main__":
    main()
