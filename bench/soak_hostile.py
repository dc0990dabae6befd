"""Soak: a healthy namespace beside hostile exporters and a hostile client.

One real `keda-gpu-scaler serve` (Kubernetes off) scrapes three healthy exporters (namespace `llm`) and
four hostile ones, each in its own process apart from the measuring one:
  - a gzip bomb: a small gzip body that inflates to far more than --max-page-bytes;
  - a ~15 MB page of ~150,000 series, different on every scrape (inside --max-page-bytes);
  - an exporter that answers 302, redirecting to a healthy exporter's page;
  - a slowloris exporter: headers, then one byte every half second;
  - a Prometheus server whose every /api/v1/query answer is a ~15 MiB vector, read by a ScaledObject of
    another namespace (`source: prometheus`);
  - tenants (bench.soak_tenants): 300 endpoint-picker replicas that never answer, a ~16 MB endpoint-picker
    page changing on every scrape, and later 2,000 pool names and an /explain hammer; the healthy
    tenant's `pending` wake is timed beside them.
A hostile client (its own process) calls at a fixed rate with thousands of distinct names and
namespaces and with invalid metadata, names and protobuf; another process opens StreamIsActive streams
and is then frozen with SIGSTOP (the scaler must drop them by keepalive and give their slots back).

Measured for the healthy ScaledObject (GetMetrics + IsActive every 100 ms, plus a StreamIsActive while
its load goes idle/busy): RPC latency p50/p99 beside the machine's floor (the gRPC health Check, called
in the same rounds: what any call costs here), UNAVAILABLE answers, pushes vs transitions; the scaler's
peak RSS against the manifests' memory limit; whether legitimate streams opened after the freeze were
refused. Writes its section of docs/SOAK.md. Run: `python -m bench.soak_hostile --minutes 4`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import itertools
import json
import os
import platform
import re
import signal
import sys
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from aiohttp import web
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.harness import ROOT, Child, categorise, page_server, percentile, profile, rss_mib, scaler
from bench.soak_crowds import (
    CROWDS,
    crowd_client,
    crowd_rows,
    crowd_setup,
    gzip_urls,
    inference_urls,
    newcomers,
    serve_crowd_pages,
)
from bench.soak_registry import product_commit, write_section
from bench.soak_tenants import (
    TENANT_ATTACK,
    HealthyGateway,
    explain_hammer,
    gateway_urls,
    keep_hostile_pools_wanted,
    many_pool_names,
    measure_wakes,
    serve_tenant_neighbours,
    tenant_rows,
    tenant_setup,
)
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb
from keda_gpu_scaler.externalscaler import externalscaler_pb2_grpc as pb_grpc

SECTION = "soak-hostile"
HEALTHY_EXPORTERS = 3
SCRAPE_INTERVAL = 2.0
KEEPALIVE_TIME = 10.0
KEEPALIVE_TIMEOUT = 5.0
POLL_EVERY = 0.1
LOAD_PHASE = 20.0  # the healthy exporters' load: busy, then idle, this long each
BUSY_UTIL = 70.0
FROZEN_STREAMS = 1000
LEGIT_STREAMS = 100
MAX_STREAMS = FROZEN_STREAMS + 50  # frozen streams alone leave no room for the legitimate ones
HOSTILE_RATE = 300.0  # RPC/s offered by the hostile client
CALM_HEAD = 30.0  # seconds with only the hostile exporters, before the hostile client and streams
PAGE_EXPORTERS = ("bomb", "big", "redirect", "slowloris", "prometheus")  # the setup's words name all of them
HOSTILE_EXPORTERS = (*PAGE_EXPORTERS, "tenants", *CROWDS)
BOMB_INFLATED = 256 * 1024 * 1024
BIG_SERIES = 150_000
PROMETHEUS_ELEMENTS = 50_000  # ~15 MiB of /api/v1/query vector
HOSTILE_PROMETHEUS = pb.ScaledObjectRef(
    name="hostile-prometheus",
    namespace="hostile-prom",
    scalerMetadata={"podNamePrefix": "vllm-", "threshold": "60", "source": "prometheus"},
)
MANIFEST = ROOT / "manifests" / "base" / "deployment.yaml"
HEALTHY = pb.ScaledObjectRef(
    name="healthy",
    namespace="llm",
    scalerMetadata={"podNamePrefix": "vllm-", "threshold": "60", "activationThreshold": "5"},
)


def memory_limit_mib() -> float | None:
    """The scaler container's memory limit in manifests/base/deployment.yaml (Mi or Gi), if it has one."""
    text = MANIFEST.read_text()
    match = re.search(r"limits:\s*\n(?:\s+\w+:.*\n)*?\s+memory:\s*\"?(\d+)(Mi|Gi)", text)
    if match is None:
        return None
    return float(match.group(1)) * (1024 if match.group(2) == "Gi" else 1)


# ---------------------------------------------------------------- the hostile exporters (own process)


def bomb_body() -> bytes:
    """A valid-looking exposition line repeated to BOMB_INFLATED bytes, gzip-compressed (~1000:1)."""
    line = (
        b'DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="bomb",container="main",namespace="bomb",pod="bomb-0"} 50\n'
    )
    chunk = line * (1024 * 1024 // len(line))
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)  # wbits 31: gzip framing
    parts = [compressor.compress(chunk) for _ in range(BOMB_INFLATED // len(chunk))]
    parts.append(compressor.flush())
    return b"".join(parts)


def big_page() -> tuple[bytes, bytes]:
    """(the first line's prefix, the rest) of a ~15 MB page of BIG_SERIES GPU_UTIL series."""
    head = b"# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
    lines = [
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i % 8}",UUID="GPU-{i:06d}",container="main",'
        f'namespace="hostile-big",pod="big-{i // 8}"}} {i % 97}\n'
        for i in range(1, BIG_SERIES)
    ]
    first = b'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-000000",container="main",namespace="hostile-big",pod="big-0"} '
    return head + first, "".join(lines).encode()


def prometheus_vector(shift: int) -> bytes:
    """A /api/v1/query answer of PROMETHEUS_ELEMENTS GPU series of one namespace (~15 MiB)."""
    result = ",".join(
        f'{{"metric":{{"__name__":"DCGM_FI_DEV_GPU_UTIL","gpu":"{i % 8}","UUID":"GPU-{i:08d}",'
        f'"Hostname":"node-{i // 8}","container":"main","namespace":"hostile-prom","pod":"vllm-{i // 8}",'
        f'"job":"dcgm-exporter","instance":"10.0.{i // 2000}.{i % 250}:9400","modelName":"NVIDIA H100 80GB HBM3",'
        f'"pci_bus_id":"00000000:{i % 256:02X}:00.0"}},"value":[1700000000.000,"{(i + shift) % 100}"]}}'
        for i in range(PROMETHEUS_ELEMENTS)
    )
    return f'{{"status":"success","data":{{"resultType":"vector","result":[{result}]}}}}'.encode()


async def serve_hostile_exporters(redirect_to: str) -> None:
    counts: Counter[str] = Counter()
    tenant_ports, tenant_sizes, stop_tenants = await serve_tenant_neighbours(counts)
    crowd_port, stop_crowds = await serve_crowd_pages(counts)
    bomb = bomb_body()
    big_first, big_rest = big_page()
    vectors = (prometheus_vector(0), prometheus_vector(1))
    headers = {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}

    async def gzip_bomb(_: web.Request) -> web.Response:
        counts["bomb"] += 1
        return web.Response(body=bomb, headers={**headers, "Content-Encoding": "gzip"})

    async def big(_: web.Request) -> web.Response:
        counts["big"] += 1
        # A different value on every scrape: the page's digest changes, so it is parsed every time.
        return web.Response(body=big_first + f"{counts['big'] % 100}\n".encode() + big_rest, headers=headers)

    async def redirect(_: web.Request) -> web.Response:
        counts["redirect"] += 1
        return web.Response(status=302, headers={"Location": redirect_to})

    async def prometheus(_: web.Request) -> web.Response:
        counts["prometheus"] += 1
        return web.Response(body=vectors[counts["prometheus"] % 2], content_type="application/json")

    async def stats(_: web.Request) -> web.Response:
        return web.json_response(
            {
                **counts,
                "bomb_bytes": len(bomb),
                "big_bytes": len(big_first + big_rest) + 3,
                "prometheus_bytes": len(vectors[0]),
                "fat_epp_bytes": tenant_sizes.get("fat_epp_bytes", 0),
            }
        )

    ports: dict[str, int] = {}
    runners = []
    routes = (
        ("bomb", "/metrics", gzip_bomb),
        ("big", "/metrics", big),
        ("redirect", "/metrics", redirect),
        ("prometheus", "/api/v1/query", prometheus),
        ("control", "/stats", stats),
    )
    for name, path, handler in routes:
        app = web.Application()
        if name == "prometheus":
            app.router.add_post(path, handler)
        else:
            app.router.add_get(path, handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        ports[name] = runner.addresses[0][1]

    async def slowloris(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        counts["slowloris"] += 1
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, ConnectionError):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 10000000\r\n\r\n")
            while True:  # one byte every half second: the scrape timeout must end it
                writer.write(b"#")
                await writer.drain()
                await asyncio.sleep(0.5)
        writer.close()

    loris = await asyncio.start_server(slowloris, "127.0.0.1", 0)
    ports["slowloris"] = loris.sockets[0].getsockname()[1]
    ports.update(tenant_ports, crowds=crowd_port)
    print(json.dumps(ports), flush=True)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    loris.close()
    await stop_tenants()
    await stop_crowds()
    for runner in runners:
        await runner.cleanup()


# ---------------------------------------------------------------- the hostile client (own process)


def hostile_requests(i: int) -> list[tuple[str, bytes]]:
    """The calls of hostile round i: (method, serialised request); half new valid names, half invalid."""
    meta = {"podNamePrefix": "vllm-", "threshold": "60"}
    kind = i % 8
    if kind < 4:  # a new ScaledObject: distinct name and namespace, valid metadata
        ref = pb.ScaledObjectRef(name=f"h-so-{i}", namespace=f"h-ns-{i}", scalerMetadata=meta)
        metrics = pb.GetMetricsRequest(scaledObjectRef=ref, metricName="gpu-utilization")
        raw = ref.SerializeToString()
        return [("GetMetricSpec", raw), ("GetMetrics", metrics.SerializeToString()), ("IsActive", raw)]
    if kind == 4:  # invalid metadata: unknown key, non-ASCII digits, huge KEDA key
        bad = [
            {**meta, "thresh0ld": "60"},
            {**meta, "threshold": "５０"},
            {**meta, "scalerAddress": "x" * 1_000_000},
            {**meta, "threshold": "1e-320"},
        ][i // 8 % 4]
        ref = pb.ScaledObjectRef(name=f"h-bad-{i}", namespace=f"h-ns-{i}", scalerMetadata=bad)
    elif kind == 5:  # invalid names: 300 characters, upper case, a dot in a namespace
        name, namespace = [
            ("n" * 300, "h-ns"),
            (f"Bad-{i}", "h-ns"),
            (f"h-{i}", f"Bad.NS-{i}"),
            ("", ""),
        ][i // 8 % 4]
        ref = pb.ScaledObjectRef(name=name, namespace=namespace, scalerMetadata=meta)
    elif kind == 6:  # not a protobuf message at all
        return [("IsActive", b"\xff\xff\xff\xff garbage"), ("GetMetricSpec", b"\x0a\xff\xff\xff\xff\x0f")]
    else:  # the healthy namespace with many names: followed, answered from the same data
        ref = pb.ScaledObjectRef(name=f"h-llm-{i}", namespace="llm", scalerMetadata=meta)
    return [("GetMetricSpec", ref.SerializeToString()), ("IsActive", ref.SerializeToString())]


async def hostile_client(target: str, rate: float, seconds: float) -> None:
    codes: Counter[str] = Counter()
    if rate <= 0:  # no hostile client: the attack is the exporters and the frozen streams only
        await asyncio.sleep(seconds)
        print(json.dumps({"rounds": 0, "codes": {}}), flush=True)
        return
    async with grpc.aio.insecure_channel(
        target, options=[("grpc.max_send_message_length", 8 << 20)]
    ) as channel:
        calls = {
            m: channel.unary_unary(f"/externalscaler.ExternalScaler/{m}")
            for m in ("GetMetricSpec", "GetMetrics", "IsActive")
        }

        async def one_round(i: int) -> None:
            for method, request in hostile_requests(i):
                try:
                    await calls[method](request, timeout=10)
                    codes[f"{method} OK"] += 1
                except grpc.aio.AioRpcError as error:
                    codes[f"{method} {error.code().name}"] += 1

        loop = asyncio.get_running_loop()
        start = loop.time()
        tasks: set[asyncio.Task[None]] = set()
        i = 0
        sent = 0
        # Rounds hold 2-3 calls: schedule rounds so that calls go out at about `rate` per second.
        while loop.time() - start < seconds:
            due = start + sent / rate
            if due > loop.time():
                await asyncio.sleep(due - loop.time())
            sent += len(hostile_requests(i))
            task = asyncio.create_task(one_round(i))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
        await asyncio.gather(*tasks)
    print(json.dumps({"rounds": i, "codes": dict(codes)}), flush=True)


# ---------------------------------------------------------------- frozen streams (own process)


async def frozen_streams(target: str, count: int) -> None:
    """Open `count` StreamIsActive streams over 10 connections, say so, then do nothing: the parent
    checks the scaler's open-streams gauge and freezes this process with SIGSTOP."""
    channels = [
        grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(10)
    ]
    stubs = [pb_grpc.ExternalScalerStub(c) for c in channels]
    meta = {"podNamePrefix": "vllm-", "threshold": "60"}

    async def hold(index: int) -> None:
        ref = pb.ScaledObjectRef(name=f"frozen-{index % 100}", namespace="llm", scalerMetadata=meta)
        call = stubs[index % len(stubs)].StreamIsActive(ref)
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            async for _ in call:
                pass

    tasks = [asyncio.create_task(hold(i)) for i in range(count)]
    await asyncio.sleep(1)
    print(json.dumps({"started": count}), flush=True)
    await asyncio.sleep(3600)
    for task in tasks:
        task.cancel()


# ---------------------------------------------------------------- the measuring process


async def spawn(*args: str) -> tuple[Child, dict[str, Any]]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.soak_hostile",
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    child = Child(process)
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 120)
    if not line:
        err = (await process.stderr.read()).decode()[-2000:] if process.stderr else ""
        raise RuntimeError(f"{args[:2]} exited before it was ready: {err}")
    child.drain(process.stderr)
    return child, json.loads(line)


async def start_role(role: str, *args: str) -> asyncio.subprocess.Process:
    """One of the soak's own processes (--role), its output piped."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.soak_hostile",
        "--role",
        role,
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def last_json(process: asyncio.subprocess.Process, timeout: float) -> Any:
    """The last line a role process printed (its summary), once it ended; None if it printed none."""
    out, _ = await asyncio.wait_for(process.communicate(), timeout)
    return json.loads(out.decode().strip().splitlines()[-1]) if out.strip() else None


async def run(minutes: float, with_profile: bool, exporters_used: list[str], rate: float) -> str:
    seconds = minutes * 60
    if seconds < CALM_HEAD + 30:
        raise SystemExit("--minutes must leave at least 30 s after the first 30 s")
    latencies: dict[str, list[float]] = {
        key: []
        for key in (
            "calm",
            "attacked",
            "floor calm",
            "floor attacked",
            "GetMetrics calm",
            "GetMetrics attacked",
        )
    }
    codes: Counter[str] = Counter()
    rss: list[tuple[float, float]] = []
    open_streams: list[tuple[float, float]] = []
    result: dict[str, Any] = {}
    commit = product_commit()  # the scaler below imports the product as it is now
    gateway = HealthyGateway()
    await gateway.start()
    async with page_server(HEALTHY_EXPORTERS) as pages:
        exporters, ports = await spawn("--role", "exporters", "--redirect-to", pages.url(0))
        env = {"KEDA_GPU_SCALER_GATEWAY_URL": gateway_urls(ports, gateway.port, "tenants" in exporters_used)}
        if "models" in exporters_used:
            env["KEDA_GPU_SCALER_INFERENCE_URL"] = inference_urls(ports["crowds"])
        hostile_urls = {
            name: f"http://127.0.0.1:{port}/metrics"
            for name, port in ports.items()
            if name in exporters_used and name != "prometheus"
        }
        if "gzip" in exporters_used:
            hostile_urls.update({f"gzip pod {i}": url for i, url in enumerate(gzip_urls(ports["crowds"]))})
        prometheus = {}
        if "prometheus" in exporters_used:
            prometheus["prometheus_url"] = f"http://127.0.0.1:{ports['prometheus']}"
        try:
            async with scaler(
                [*(pages.url(i) for i in range(HEALTHY_EXPORTERS)), *hostile_urls.values()],
                **prometheus,
                scrape_interval=f"{SCRAPE_INTERVAL:g}",
                keepalive_time=f"{KEEPALIVE_TIME:g}",
                keepalive_timeout=f"{KEEPALIVE_TIMEOUT:g}",
                max_streams=str(MAX_STREAMS),
                explain="on",
                extra_env=env,
            ) as server:
                result = await attack(
                    server,
                    pages,
                    gateway,
                    seconds,
                    with_profile,
                    rate,
                    latencies,
                    codes,
                    rss,
                    open_streams,
                    exporters_used,
                    ports["crowds"],
                )
                result["scaler_peak_rss"] = rss_mib(server.child.pid)[1]
                result["scaler_log"] = list(server.child.tail)
            async with (
                aiohttp.ClientSession() as http,
                http.get(f"http://127.0.0.1:{ports['control']}/stats") as response,
            ):
                result["exporter_stats"] = await response.json()
        finally:
            await exporters.stop()
            await gateway.stop()
    result["rate"] = rate
    result["exporters"] = exporters_used
    result["commit"] = commit
    return report(minutes, latencies, codes, rss, open_streams, hostile_urls, result)


async def attack(
    server: Any,
    pages: Any,
    gateway: HealthyGateway,
    seconds: float,
    with_profile: bool,
    rate: float,
    latencies: dict[str, list[float]],
    codes: Counter[str],
    rss: list[tuple[float, float]],
    open_streams: list[tuple[float, float]],
    used: list[str],
    crowd_port: int,
) -> dict[str, Any]:
    result: dict[str, Any] = {}
    channel = grpc.aio.insecure_channel(server.target)
    stub = pb_grpc.ExternalScalerStub(channel)
    health = health_pb2_grpc.HealthStub(channel)
    http = aiohttp.ClientSession()
    t0 = time.monotonic()
    cpu = [
        (t0, server.child.cpu())
    ]  # (when, the scaler's CPU seconds): at the start of each phase, and the end
    phase = "calm"
    # KEDA calls GetMetricSpec when it reconciles the ScaledObject, and GetMetrics at the HPA's next
    # sync: collection starts with the first call, so the polls begin once every exporter was tried.
    await stub.GetMetricSpec(HEALTHY)
    await asyncio.sleep(2 * SCRAPE_INTERVAL)

    metrics_failed: Counter[str] = Counter()
    result["metrics_failed"] = metrics_failed

    async def poll() -> None:
        request = pb.GetMetricsRequest(scaledObjectRef=HEALTHY, metricName="gpu-utilization")
        while True:
            for method, message in (("GetMetrics", request), ("IsActive", HEALTHY)):
                started = time.perf_counter()
                try:
                    await getattr(stub, method)(message, timeout=10)
                    codes[f"{phase} {method} OK"] += 1
                except grpc.aio.AioRpcError as error:
                    codes[f"{phase} {method} {error.code().name}"] += 1
                    errors.setdefault(error.code().name, f"{method}: {(error.details() or '')[:300]}")
                latencies[phase].append(time.perf_counter() - started)
                if method == "GetMetrics":
                    latencies[f"GetMetrics {phase}"].append(time.perf_counter() - started)
            # The floor: the cheapest call the server has, through the same channel and loop.
            started = time.perf_counter()
            with contextlib.suppress(grpc.aio.AioRpcError):
                await health.Check(health_pb2.HealthCheckRequest(), timeout=10)
                latencies[f"floor {phase}"].append(time.perf_counter() - started)
            await asyncio.sleep(POLL_EVERY)

    async def poll_hostile_prometheus() -> None:
        # Called like KEDA would call it, so that its namespace stays followed: never counted as healthy.
        request = pb.GetMetricsRequest(scaledObjectRef=HOSTILE_PROMETHEUS, metricName="gpu-utilization")
        await stub.GetMetricSpec(HOSTILE_PROMETHEUS)
        while True:
            try:
                await stub.GetMetrics(request, timeout=30)
                result["prometheus_answer"] = "OK"
            except grpc.aio.AioRpcError as error:
                result["prometheus_answer"] = f"{error.code().name}: {(error.details() or '')[:240]}"
            await asyncio.sleep(1)

    pushes: list[float] = []
    errors: dict[str, str] = {}
    result["healthy_errors"] = errors
    scrape_failures: dict[str, str] = {}
    result["scrape_failures"] = scrape_failures

    async def healthy_stream() -> None:
        call = stub.StreamIsActive(HEALTHY)
        with contextlib.suppress(asyncio.CancelledError):
            try:
                async for _message in call:
                    pushes.append(time.monotonic() - t0)
                result["healthy_stream_end"] = (await call.code()).name
            except grpc.aio.AioRpcError as error:
                result["healthy_stream_end"] = error.code().name

    transitions = [time.monotonic() - t0]  # busy at the start: the stream's first true

    async def load() -> None:
        busy = True
        while True:
            await asyncio.sleep(LOAD_PHASE)
            busy = not busy
            for i in range(HEALTHY_EXPORTERS):
                await pages.set_util(http, i, BUSY_UTIL if busy else 0)
            if busy:
                transitions.append(time.monotonic() - t0)

    async def sampler() -> None:
        while True:
            for line in list(server.child.tail):  # the last lines of the scaler's log
                if "scrape of " in line and " failed: " in line:
                    url, _, why = line.partition("scrape of ")[2].partition(" failed: ")
                    scrape_failures[url] = why[:160]
            rss.append((time.monotonic() - t0, rss_mib(server.child.pid)[0]))
            try:
                async with http.get(
                    f"http://127.0.0.1:{server.http_port}/metrics", timeout=aiohttp.ClientTimeout(total=5)
                ) as response:
                    text = await response.text()
            except (aiohttp.ClientError, TimeoutError) as error:
                metrics_failed[f"{phase} {type(error).__name__}"] += 1
                text = ""
            else:
                for line in text.splitlines():
                    if line.startswith("keda_gpu_scaler_open_streams "):
                        open_streams.append((time.monotonic() - t0, float(line.split()[1])))
                    if line.startswith("keda_gpu_scaler_scaledobjects_followed "):
                        result["followed_last"] = float(line.split()[1])
                        result["followed_max"] = max(result["followed_last"], result.get("followed_max", 0))
            await asyncio.sleep(1)

    tasks = [poll, healthy_stream, load, sampler] + (
        [poll_hostile_prometheus] if "prometheus" in used else []
    )
    background = [asyncio.create_task(f()) for f in tasks]
    wakes: dict[str, Any] = {}
    result["wakes"] = wakes
    background.append(asyncio.create_task(measure_wakes(stub, gateway, lambda: phase, wakes)))
    if "tenants" in used:
        background.append(asyncio.create_task(keep_hostile_pools_wanted(stub)))
    await asyncio.sleep(max(0.0, CALM_HEAD - (time.monotonic() - t0)))

    # The attack: issue #39's crowds, frozen streams (they must get their slots), then the hostile client.
    phase = "attacked"
    cpu.append((time.monotonic(), server.child.cpu()))
    crowd_seconds = f"{seconds - CALM_HEAD - 15:.0f}"
    crowds = {
        c: await start_role(c, "--target", server.target, "--seconds", crowd_seconds)
        for c in used
        if c in CROWDS
    }
    if "gzip" in used:
        async with http.post(f"http://127.0.0.1:{crowd_port}/arm") as response:
            response.raise_for_status()
    if "flood" in used:
        background.append(asyncio.create_task(newcomers(stub, result)))
    frozen, _ = await spawn("--role", "frozen", "--target", server.target, "--count", str(FROZEN_STREAMS))
    # Frozen only once the scaler holds every one of them (its open-streams gauge).
    for _ in range(120):  # at most 60 s
        if open_streams and open_streams[-1][1] >= FROZEN_STREAMS:
            break
        await asyncio.sleep(0.5)
    result["frozen_opened"] = f"{open_streams[-1][1]:.0f} open on the scaler" if open_streams else "?"
    os.kill(frozen.pid, signal.SIGSTOP)
    frozen_at = time.monotonic() - t0
    result["frozen_at"] = frozen_at
    client_seconds = seconds - (time.monotonic() - t0) - 15
    hammer = None
    if "tenants" in used:
        # The tenants' later neighbours: 2,000 pool names from one ScaledObject, and the /explain hammer.
        background.append(asyncio.create_task(many_pool_names(stub, max(5.0, client_seconds / 2), result)))
        explain_url = f"http://127.0.0.1:{server.http_port}"
        hammer = await start_role(
            "explain", "--target", explain_url, "--seconds", f"{max(5.0, client_seconds):.0f}"
        )
    hostile = await start_role(
        "client", "--target", server.target, "--rate", f"{rate:g}", "--seconds", f"{client_seconds:.0f}"
    )
    try:
        # Legitimate streams once keepalive had time to drop the frozen ones (time + timeout + margin).
        await asyncio.sleep(KEEPALIVE_TIME + KEEPALIVE_TIMEOUT + 10)
        legit_codes: Counter[str] = Counter()
        legit_calls = []
        for index in range(LEGIT_STREAMS):
            ref = pb.ScaledObjectRef(
                name=f"legit-{index}", namespace="llm", scalerMetadata=HEALTHY.scalerMetadata
            )
            legit_calls.append(stub.StreamIsActive(ref))
        await asyncio.sleep(3)
        for call in legit_calls:
            legit_codes[
                "refused"
                if call.done() and await call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                else "open"
            ] += 1
        result["legit_streams"] = dict(legit_codes)
        result["legit_at"] = time.monotonic() - t0

        profile_task = None
        if with_profile:
            profile_task = asyncio.create_task(profile(server.child.pid, 20))
        # A new legitimate ScaledObject, late in the run (after the hostile client's many names).
        await asyncio.sleep(max(0.0, seconds - 30 - (time.monotonic() - t0)))
        try:
            await stub.GetMetricSpec(
                pb.ScaledObjectRef(name="late", namespace="late-team", scalerMetadata=HEALTHY.scalerMetadata)
            )
            result["late_scaledobject"] = "OK"
        except grpc.aio.AioRpcError as error:
            result["late_scaledobject"] = f"{error.code().name}: {error.details()[:160]}"
        result["late_at"] = time.monotonic() - t0
        if profile_task is not None:
            result["profile"] = await profile_task
        result["hostile_client"] = await last_json(hostile, client_seconds + 120)
        if hammer is not None:
            result["explain_hammer"] = await last_json(hammer, client_seconds + 120)
        for crowd, process in crowds.items():
            result[f"crowd_{crowd}"] = await last_json(process, client_seconds + 120)
        for call in legit_calls:
            call.cancel()
    finally:
        for process in (hostile, *([hammer] if hammer else []), *crowds.values()):
            if process.returncode is None:
                process.kill()
                await process.wait()
        os.kill(frozen.pid, signal.SIGCONT)
        await frozen.stop(grace=2)
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await http.close()
        await channel.close()
    result["pushes"] = pushes
    result["transitions"] = transitions
    result["seconds"] = time.monotonic() - t0
    cpu.append((time.monotonic(), server.child.cpu()))
    result["cpu_percent"] = [100 * (c1 - c0) / (w1 - w0) for (w0, c0), (w1, c1) in itertools.pairwise(cpu)]
    return result


def report(
    minutes: float,
    latencies: dict[str, list[float]],
    codes: Counter[str],
    rss: list[tuple[float, float]],
    open_streams: list[tuple[float, float]],
    hostile_urls: dict[str, str],
    r: dict[str, Any],
) -> str:
    limit = memory_limit_mib()
    peak = r["scaler_peak_rss"]
    crowds = [c for c in r["exporters"] if c in CROWDS]
    everything = latencies["calm"] + latencies["attacked"]

    def stats(values: list[float]) -> str:
        if not values:
            return "no calls"
        return (
            f"{len(values)} calls, p50 {1000 * percentile(values, 50):.1f} ms, p99 {1000 * percentile(values, 99):.1f} ms,"
            f" max {1000 * max(values):.0f} ms"
        )

    p99 = 1000 * percentile(everything, 99)
    unavailable = sum(n for key, n in codes.items() if key.endswith("UNAVAILABLE"))
    not_ok = {k: n for k, n in codes.items() if not k.endswith(" OK")}
    frozen_at = r["frozen_at"]
    dropped_at = next(
        (
            at
            for at, value in open_streams
            if at > frozen_at and value <= 1 + LEGIT_STREAMS and value < FROZEN_STREAMS
        ),
        None,
    )
    peak_streams = max((v for _, v in open_streams), default=float("nan"))
    expected_pushes = len(r["transitions"])
    failures = {
        name: r["scrape_failures"].get(url, "(no failure logged)") for name, url in hostile_urls.items()
    }
    stats_ = r.get("exporter_stats", {})
    hostile = r.get("hostile_client") or {}
    goal_p99 = p99 <= 10.0
    goal_unavailable = unavailable == 0
    goal_rss = limit is not None and peak < limit
    command = f"python -m bench.soak_hostile --minutes {minutes:g}"
    if "profile" in r:
        command += " --profile"
    if list(r["exporters"]) != list(HOSTILE_EXPORTERS):
        command += " --exporters " + (",".join(r["exporters"]) or "''")
    if r["rate"] != HOSTILE_RATE:
        command += f" --rate {r['rate']:g}"
    title = (
        "## Soak: hostile neighbours (gzip bomb, 15 MB changing page, redirects, slowloris, 15 MiB"
        " Prometheus answers, hostile tenants, hostile client)"
    )
    if variant(list(r["exporters"]), r["rate"]):
        title = (
            f"### Hostile neighbours, in part: hostile exporters {', '.join(r['exporters']) or 'none'},"
            f" hostile client at {r['rate']:g} RPC/s"
        )
    lines = [
        title,
        "",
        f"Date: {datetime.date.today().isoformat()}. Machine: {platform.machine()}, 2 cores (shared with the"
        f" load generators and other work), Python {platform.python_version()}.",
        f"Command: `{command}`. Product: commit {r['commit']}.",
        "",
        f"Setup: `keda-gpu-scaler serve --kubernetes off --scrape-interval {SCRAPE_INTERVAL:g} --keepalive-time"
        f" {KEEPALIVE_TIME:g} --keepalive-timeout {KEEPALIVE_TIMEOUT:g} --max-streams {MAX_STREAMS} --explain on`,"
        " other flags at their defaults (--max-page-bytes 16 MiB, --scrape-timeout 3, --interest-ttl 600,"
        f" --max-scaledobjects 5000). Healthy: {HEALTHY_EXPORTERS} exporters (8-GPU dcgm-exporter pages,"
        f" namespace `llm`), their load busy ({BUSY_UTIL:g} %) / idle every {LOAD_PHASE:g} s; ScaledObject"
        f" `llm/healthy` polled GetMetrics + IsActive every {1000 * POLL_EVERY:g} ms, plus one StreamIsActive."
        + (
            f" Hostile exporters, from the start: a gzip bomb ({stats_.get('bomb_bytes', '?')} bytes inflating to"
            f" {BOMB_INFLATED >> 20} MiB), a {stats_.get('big_bytes', 0) / 1e6:.1f} MB page of {BIG_SERIES} series"
            " changing on every scrape, a 302 to a healthy exporter's page, a slowloris (headers, then 1 byte per"
            f" 0.5 s), a Prometheus (`--prometheus-url`) answering every query with a"
            f" {stats_.get('prometheus_bytes', 0) / 2**20:.1f} MiB vector of {PROMETHEUS_ELEMENTS:,} series, read by"
            " `hostile-prom/hostile-prometheus` (`source: prometheus`, GetMetrics every second)."
            if set(r["exporters"]) & set(PAGE_EXPORTERS)
            else ""
        )
        + (tenant_setup(stats_.get("fat_epp_bytes", 0)) if "tenants" in r["exporters"] else "")
        + " From"
        f" {CALM_HEAD:g} s: {FROZEN_STREAMS} StreamIsActive streams in a process then frozen with"
        f" SIGSTOP, and a hostile client at {r['rate']:g} RPC/s (half new ScaledObjects each with its own name"
        " and namespace, the rest invalid metadata, invalid names, garbage protobuf, or many names in `llm`)"
        + (TENANT_ATTACK if "tenants" in r["exporters"] else ".")
        + (crowd_setup(crowds) if crowds else ""),
        "",
        "| check | result | goal |",
        "|---|---|---|",
        f"| healthy RPCs, all | {stats(everything)} | p99 ≤ 10 ms: {'met' if goal_p99 else f'missed by {p99 - 10:.1f} ms'} |",
        f"| healthy RPCs, hostile exporters only (first {CALM_HEAD:g} s) | {stats(latencies['calm'])} | |",
        f"| healthy RPCs, under the whole attack | {stats(latencies['attacked'])} | |",
        f"| the machine's floor: gRPC health Check in the same rounds, first {CALM_HEAD:g} s"
        f" | {stats(latencies['floor calm'])} | |",
        f"| the machine's floor under the whole attack | {stats(latencies['floor attacked'])} | |",
        f"| healthy answers other than OK | {not_ok or 'none'}"
        f"{''.join(f'; {code}: `{text}`' for code, text in r['healthy_errors'].items())} | no UNAVAILABLE: {'met' if goal_unavailable else f'missed ({unavailable})'} |",
        f"| healthy stream: pushes / idle → busy transitions | {len(r['pushes'])} / {expected_pushes};"
        f" ended {r.get('healthy_stream_end', 'open until the end')} | one push per transition |",
        f"| scaler peak RSS (VmHWM) | {peak:.0f} MiB | under the manifests' limit ({limit:g} Mi):"
        f" {'met' if goal_rss else 'missed'} |",
        f"| scaler RSS first / max before the hostile client and streams ({CALM_HEAD:g} s) / last (MiB) |"
        f" {rss[0][1]:.0f} / {max(v for at, v in rss if at <= frozen_at):.0f} / {rss[-1][1]:.0f} | |",
        f"| frozen streams opened, then SIGSTOP at | {r['frozen_opened']} at {frozen_at:.0f} s | |",
        f"| open streams (gauge): peak; back to ≤ {1 + LEGIT_STREAMS} at | {peak_streams:.0f};"
        f" {f'{dropped_at:.0f} s ({dropped_at - frozen_at:.0f} s after the freeze)' if dropped_at else 'never'} |"
        f" dropped by keepalive ({KEEPALIVE_TIME:g} + {KEEPALIVE_TIMEOUT:g} s) |",
        f"| {LEGIT_STREAMS} legitimate streams opened at {r['legit_at']:.0f} s | {r['legit_streams']} | none refused |",
        f"| a new legitimate ScaledObject at {r['late_at']:.0f} s (GetMetricSpec) | {r['late_scaledobject']} | OK |",
        f"| followed ScaledObjects at the end (gauge) | {r.get('followed_last', float('nan')):.0f} | |",
        *(tenant_rows(r, CALM_HEAD) if "tenants" in r["exporters"] else []),
        *(crowd_rows(r, latencies) if crowds else []),
        f"| hostile client | {hostile.get('rounds', '?')} rounds; {dict(sorted((hostile.get('codes') or {}).items()))} | |",
        f"| hostile exporters' requests | { {k: v for k, v in stats_.items() if not k.endswith('_bytes')} } | |",
        "",
        "What the scaler said about each hostile exporter (its last log line):",
        "",
        *(f"- {name}: `{text}`" for name, text in failures.items()),
        *(
            [f"- prometheus (GetMetrics of `hostile-prom/hostile-prometheus`): `{r['prometheus_answer']}`"]
            if "prometheus_answer" in r
            else []
        ),
    ]
    if "profile" in r:
        rules = [
            ("parsing pages (exposition)", "exposition"),
            ("scrape path (collect/)", "collect/"),
            ("evaluation (evaluator, scaling)", "evaluator"),
            ("gRPC service", "service.py"),
            ("trigger parsing", "trigger_parse.py"),
            ("/metrics (prometheus_client)", "prometheus_client"),
            ("aiohttp", "aiohttp"),
            ("gRPC (grpc/aio)", "grpc"),
            ("event loop", "asyncio"),
        ]
        lines += [
            "",
            "Where the scaler's CPU went during 20 s of the attack (py-spy --gil):",
            "",
            categorise(r["profile"], rules, "other"),
            "",
            top_frames(r["profile"]),
        ]
    return "\n".join(lines) + "\n"


def top_frames(stacks: list[tuple[list[str], int]], count: int = 8) -> str:
    """The frames the samples were in (the innermost Python frame of each sample), most first."""
    total = sum(n for _, n in stacks)
    own: Counter[str] = Counter()
    for frames, n in stacks:
        if frames:
            own[frames[-1]] += n
    if not total:
        return ""
    rows = [f"| `{frame[:120]}` | {100 * n / total:.0f} % |" for frame, n in own.most_common(count)]
    return "\n".join(["| innermost frame | share of samples |", "|---|---|", *rows])


def variant(exporters: list[str], rate: float) -> str:
    """ "" for the whole attack, else a name for a run with only some of it (its own section)."""
    if list(exporters) == list(HOSTILE_EXPORTERS) and rate == HOSTILE_RATE:
        return ""
    return f"{'-'.join(exporters) or 'none'}-rate{rate:g}"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=4.0)
    p.add_argument(
        "--profile", action="store_true", help="sample the scaler with py-spy for 20 s of the attack"
    )
    p.add_argument(
        "--exporters",
        default=",".join(HOSTILE_EXPORTERS),
        help="hostile exporters the scaler scrapes, comma-separated (default: all of %(default)s)",
    )
    p.add_argument("--rate", type=float, default=HOSTILE_RATE, help="hostile client's RPC/s (0: none)")
    p.add_argument("--output", type=Path, default=ROOT / "docs" / "SOAK.md")
    # The processes the soak starts itself.
    p.add_argument(
        "--role",
        choices=("soak", "exporters", "client", "frozen", "explain", *CROWDS[1:]),
        default="soak",
        help=argparse.SUPPRESS,
    )
    p.add_argument("--redirect-to", default="", help=argparse.SUPPRESS)
    p.add_argument("--target", default="", help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, default=60.0, help=argparse.SUPPRESS)
    p.add_argument("--count", type=int, default=FROZEN_STREAMS, help=argparse.SUPPRESS)
    return p


def main() -> None:
    args = parser().parse_args()
    if args.role == "exporters":
        asyncio.run(serve_hostile_exporters(args.redirect_to))
    elif args.role == "client":
        asyncio.run(hostile_client(args.target, args.rate, args.seconds))
    elif args.role == "frozen":
        asyncio.run(frozen_streams(args.target, args.count))
    elif args.role == "explain":
        asyncio.run(explain_hammer(args.target, args.seconds))
    elif args.role in CROWDS:
        asyncio.run(crowd_client(args.role, args.target, args.seconds))
    else:
        given = [name for name in args.exporters.split(",") if name]
        unknown = set(given) - set(HOSTILE_EXPORTERS)
        if unknown:
            raise SystemExit(
                f"--exporters: unknown {sorted(unknown)}; choose from {','.join(HOSTILE_EXPORTERS)}"
            )
        exporters = [name for name in HOSTILE_EXPORTERS if name in given]
        text = asyncio.run(run(args.minutes, args.profile, exporters, args.rate))
        print(text)
        with contextlib.suppress(OSError):
            part = variant(exporters, args.rate)
            write_section(args.output, f"{SECTION}-{part}" if part else SECTION, text)


if __name__ == "__main__":
    main()
