"""KEDA-shaped gRPC load generator, run as its own process: GetMetricSpec, GetMetrics, IsActive per poll."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
from typing import Any

import grpc

from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb

SERVICE = "/externalscaler.ExternalScaler/"
# (namespace, podNamePrefix) of the workloads the page server's pages describe.
# grpc.health.v1.HealthCheckRequest{service: ""}: an empty message.
HEALTH_REQUEST = b""
WORKLOADS = (("llm", "vllm-"), ("embed", "text-embeddings-"), ("vision", "triton-"))


def requests_for(objects: int) -> list[tuple[bytes, bytes]]:
    """Pre-serialised (ScaledObjectRef, GetMetricsRequest) per ScaledObject: the client spends no CPU on it."""
    out = []
    for i in range(objects):
        namespace, prefix = WORKLOADS[i % len(WORKLOADS)]
        ref = pb.ScaledObjectRef(
            name=f"so-{i}",
            namespace=namespace,
            scalerMetadata={
                "scalerAddress": "keda-gpu-scaler.keda:6000",
                "podNamePrefix": prefix,
                "threshold": str(50 + i % 40),
                "activationThreshold": "5",
            },
        )
        metrics = pb.GetMetricsRequest(scaledObjectRef=ref, metricName="gpu-utilization")
        out.append((ref.SerializeToString(), metrics.SerializeToString()))
    return out


class Client:
    def __init__(self, channel: grpc.aio.Channel, health_only: bool = False) -> None:
        self.health_only = health_only
        self.health = channel.unary_unary("/grpc.health.v1.Health/Check")
        # No (de)serialisers: bytes go through as they are.
        self.spec = channel.unary_unary(SERVICE + "GetMetricSpec")
        self.metrics = channel.unary_unary(SERVICE + "GetMetrics")
        self.active = channel.unary_unary(SERVICE + "IsActive")
        self.latencies: list[float] = []
        self.errors = 0

    async def poll(self, ref: bytes, metrics: bytes) -> None:
        """One KEDA poll of one ScaledObject: the three calls in KEDA's order, one after another."""
        calls: tuple[tuple[grpc.aio.UnaryUnaryMultiCallable[Any, Any], bytes], ...] = (
            ((self.health, HEALTH_REQUEST),) * 3
            if self.health_only
            else ((self.spec, ref), (self.metrics, metrics), (self.active, ref))
        )
        for call, request in calls:
            started = time.perf_counter()
            try:
                await call(request)
            except grpc.aio.AioRpcError:
                self.errors += 1
                continue
            self.latencies.append(time.perf_counter() - started)


async def open_loop(
    client: Client, requests: list[tuple[bytes, bytes]], rate: float, duration: float
) -> float:
    """Start polls on a fixed schedule (rate in RPC/s) whatever the answers' speed; returns the lag."""
    loop = asyncio.get_running_loop()
    interval = 3 / rate
    start = loop.time()
    tasks: set[asyncio.Task[None]] = set()
    n = 0
    worst_lag = 0.0
    while (due := start + n * interval) < start + duration:
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        worst_lag = max(worst_lag, loop.time() - due)
        task = asyncio.create_task(client.poll(*requests[n % len(requests)]))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        n += 1
    await asyncio.gather(*tasks)
    return worst_lag


async def closed_loop(
    client: Client, requests: list[tuple[bytes, bytes]], concurrency: int, duration: float
) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + duration

    async def worker(offset: int) -> None:
        n = offset
        while loop.time() < end:
            await client.poll(*requests[n % len(requests)])
            n += concurrency

    await asyncio.gather(*(worker(i) for i in range(concurrency)))


async def main_async(args: argparse.Namespace) -> dict[str, float]:
    requests = requests_for(args.objects)
    async with grpc.aio.insecure_channel(args.target) as channel:
        warm = Client(channel)
        await asyncio.gather(*(warm.poll(*r) for r in requests))  # every trigger parsed, every path warm
        client = Client(channel, args.health_only)
        # The client is the measuring instrument: its own collections must not show up as server latency.
        gc.collect()
        gc.freeze()
        gc.disable()
        print("start", flush=True)  # the parent reads the server's CPU from here on
        cpu0, wall0 = time.process_time(), time.perf_counter()
        lag = 0.0
        if args.rate:
            lag = await open_loop(client, requests, args.rate, args.duration)
        else:
            await closed_loop(client, requests, args.concurrency, args.duration)
        cpu1, wall1 = time.process_time(), time.perf_counter()
    return {
        "calls": len(client.latencies),
        "errors": client.errors,
        "seconds": wall1 - wall0,
        "client_cpu": cpu1 - cpu0,
        "worst_schedule_lag": lag,
        "latencies": client.latencies,  # type: ignore[dict-item]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", required=True)
    parser.add_argument("--objects", type=int, default=200)
    parser.add_argument("--rate", type=float, default=0.0, help="offered RPC/s (0: closed loop)")
    parser.add_argument("--concurrency", type=int, default=32, help="closed loop: polls in flight")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument(
        "--health-only",
        action="store_true",
        help="grpc.health.v1 Check only (a near-empty handler): the gRPC layer's own ceiling",
    )
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main_async(args))))


if __name__ == "__main__":
    main()
