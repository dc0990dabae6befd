"""The hostile soak's crowds (bench.soak_hostile `--exporters gzip,models,flood`), the attacks of issue #39.

Armed at the end of the soak's first 30 s, so that those 30 s measure the healthy tenant alone:
- gzip: 6 pods of one tenant (`hostile-gzip`) whose exporter pages are 6 MB gzip bodies of empty members;
- models: 25 ScaledObjects × 16 `demand` triggers, each its own `model`, over two vLLM pods
  (`hostile-models`), every trigger's GetMetrics once per HPA sync (15 s), in its own process;
- flood: one namespace (`hostile-flood`) holding --max-scaledobjects ScaledObjects, each polled every
  30 s, in its own process; beside it another namespace creates a new ScaledObject every 10 s.
The pages are served by the hostile exporters' process (bench.soak_hostile --role exporters).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
from aiohttp import web

from bench.harness import percentile
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb
from keda_gpu_scaler.externalscaler import externalscaler_pb2_grpc as pb_grpc

CROWDS = ("gzip", "models", "flood")
GZIP_PODS = 6
GZIP_BYTES = 6_000_000
MODEL_SCALEDOBJECTS = 25
MODELS = 16
MODEL_PODS = 2
HPA_SYNC = 15.0
FLOOD_SCALEDOBJECTS = 5000  # the scaler's --max-scaledobjects default
FLOOD_POLL = 30.0
FLOOD_FILL = 20.0  # seconds over which the flood's ScaledObjects first arrive
NEWCOMER_EVERY = 10.0
WAKE_GOAL = 1.5
P99_FLOOR_MS = 50.0
HEADERS = {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}


def empty_members_body() -> bytes:
    """GZIP_BYTES of empty gzip members, one after another: a valid gzip body that inflates to nothing."""
    member = gzip.compress(b"", mtime=0)
    return member * (GZIP_BYTES // len(member))


def models_page(reads: int) -> str:
    """A vLLM page serving MODELS models; each model's finished requests grow with every read."""
    families: list[tuple[str, str, Callable[[str, int], str]]] = [
        ("vllm:num_requests_running", "gauge", lambda label, m: f"{label} {m % 4}"),
        ("vllm:num_requests_waiting", "gauge", lambda label, m: f"{label} 0"),
        (
            "vllm:request_success_total",
            "counter",
            lambda label, m: f'{label[:-1]},finished_reason="stop"}} {reads * (m + 1)}',
        ),
    ]
    lines = []
    for name, kind, sample in families:
        lines.append(f"# TYPE {name} {kind}")
        lines += [sample(f'{name}{{engine="0",model_name="model-{m}"}}', m) for m in range(MODELS)]
    return "\n".join(lines) + "\n"


async def serve_crowd_pages(counts: Counter[str]) -> tuple[int, Callable[[], Awaitable[None]]]:
    """One port serving the gzip pods' pages (/gzip-<i>/metrics, plain until POST /arm) and the two vLLM
    pages (/vllm-<i>/metrics): the port, and how to stop it."""
    body = empty_members_body()
    armed: list[bool] = []

    async def gzip_pod(_: web.Request) -> web.Response:
        counts["gzip"] += 1
        if not armed:
            return web.Response(text="# armed later\n", headers=HEADERS)
        return web.Response(body=body, headers={**HEADERS, "Content-Encoding": "gzip"})

    async def vllm(_: web.Request) -> web.Response:
        counts["models"] += 1
        return web.Response(text=models_page(counts["models"]), headers=HEADERS)

    async def arm(_: web.Request) -> web.Response:
        armed.append(True)
        return web.Response(text="armed")

    app = web.Application()
    app.router.add_get(r"/gzip-{pod:\d+}/metrics", gzip_pod)
    app.router.add_get(r"/vllm-{pod:\d+}/metrics", vllm)
    app.router.add_post("/arm", arm)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner.addresses[0][1], runner.cleanup


def gzip_urls(port: int) -> list[str]:
    return [f"http://127.0.0.1:{port}/gzip-{i}/metrics" for i in range(GZIP_PODS)]


def inference_urls(port: int) -> str:
    """KEDA_GPU_SCALER_INFERENCE_URL for the scaler: the two vLLM pods of `hostile-models`."""
    return ",".join(
        f"hostile-models/vllm-{i}=http://127.0.0.1:{port}/vllm-{i}/metrics" for i in range(MODEL_PODS)
    )


def model_triggers() -> list[pb.ScaledObjectRef]:
    """Every trigger of the many-model attack: MODEL_SCALEDOBJECTS × MODELS distinct metadata."""
    return [
        pb.ScaledObjectRef(
            name=f"models-{i}",
            namespace="hostile-models",
            scalerMetadata={
                "metric": "demand",
                "threshold": "10",
                "podNamePrefix": "vllm-",
                "model": f"model-{m}",
            },
        )
        for i in range(MODEL_SCALEDOBJECTS)
        for m in range(MODELS)
    ]


def flood_refs() -> list[pb.ScaledObjectRef]:
    """FLOOD_SCALEDOBJECTS ScaledObjects of one namespace."""
    meta = {"podNamePrefix": "vllm-", "threshold": "60"}
    return [
        pb.ScaledObjectRef(name=f"flood-{i}", namespace="hostile-flood", scalerMetadata=meta)
        for i in range(FLOOD_SCALEDOBJECTS)
    ]


async def paced(
    call: Callable[[Any], Awaitable[Any]],
    requests: Sequence[Any],
    period: float,
    until: float,
    codes: Counter[str],
) -> None:
    """Call every request once per `period`, spread evenly over it, until time.monotonic() passes `until`."""
    tasks: set[asyncio.Task[None]] = set()

    async def one(request: Any) -> None:
        try:
            await call(request)
            codes["OK"] += 1
        except grpc.aio.AioRpcError as error:
            codes[error.code().name] += 1

    start = time.monotonic()
    sent = 0
    while time.monotonic() < until:
        due = start + sent * period / len(requests)
        if due > time.monotonic():
            await asyncio.sleep(due - time.monotonic())
        task = asyncio.create_task(one(requests[sent % len(requests)]))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        sent += 1
    await asyncio.gather(*tasks)


async def crowd_client(role: str, target: str, seconds: float) -> None:
    """The models or flood crowd's calls for `seconds` (own process); prints its answers' codes."""
    until = time.monotonic() + seconds
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.ExternalScalerStub(channel)
        if role == "models":
            # As KEDA: each trigger's spec first, then GetMetrics for the metric name it answered.
            requests = []
            for ref in model_triggers():
                spec = await stub.GetMetricSpec(ref, timeout=30)
                name = spec.metricSpecs[0].metricName
                requests.append(pb.GetMetricsRequest(scaledObjectRef=ref, metricName=name))
            codes: Counter[str] = Counter()
            await paced(lambda r: stub.GetMetrics(r, timeout=30), requests, HPA_SYNC, until, codes)
            print(json.dumps({"GetMetrics": codes}), flush=True)
            return
        refs = flood_refs()
        specs: Counter[str] = Counter()
        polls: Counter[str] = Counter()
        # KEDA asks each one's spec as it reconciles it, then the HPA polls it.
        fill_end = min(until, time.monotonic() + FLOOD_FILL)
        await paced(lambda r: stub.GetMetricSpec(r, timeout=30), refs, FLOOD_FILL, fill_end, specs)

        async def metrics(ref: pb.ScaledObjectRef) -> None:
            request = pb.GetMetricsRequest(scaledObjectRef=ref, metricName="gpu-utilization")
            await stub.GetMetrics(request, timeout=30)

        await paced(metrics, refs, FLOOD_POLL, until, polls)
        print(json.dumps({"GetMetricSpec": specs, "GetMetrics": polls}), flush=True)


async def newcomers(stub: pb_grpc.ExternalScalerStub, result: dict[str, Any]) -> None:
    """Every NEWCOMER_EVERY s a new ScaledObject in a new namespace: its GetMetricSpec must be served."""
    codes: Counter[str] = Counter()
    result["newcomers"] = codes
    meta = {"podNamePrefix": "vllm-", "threshold": "60"}
    for index in range(10_000):
        ref = pb.ScaledObjectRef(name="new", namespace=f"newcomer-{index}", scalerMetadata=meta)
        try:
            await stub.GetMetricSpec(ref, timeout=10)
            codes["OK"] += 1
        except grpc.aio.AioRpcError as error:
            codes[error.code().name] += 1
            result.setdefault("newcomer_error", (error.details() or "")[:200])
        await asyncio.sleep(NEWCOMER_EVERY)


def crowd_setup(crowds: Sequence[str]) -> str:
    """The report's words for the crowds in use."""
    words = {
        "gzip": f"{GZIP_PODS} pods of `hostile-gzip` whose exporter pages became {GZIP_BYTES / 1e6:g} MB gzip"
        " bodies of empty members",
        "models": f"{MODEL_SCALEDOBJECTS} ScaledObjects × {MODELS} `demand` triggers, each its own `model`, over"
        f" {MODEL_PODS} vLLM pods of `hostile-models`, every trigger's GetMetrics every {HPA_SYNC:g} s (own"
        " process)",
        "flood": f"{FLOOD_SCALEDOBJECTS:,} ScaledObjects of `hostile-flood` (GetMetricSpec over {FLOOD_FILL:g} s,"
        f" then each one's GetMetrics every {FLOOD_POLL:g} s, own process), while a new namespace's new"
        f" ScaledObject asks GetMetricSpec every {NEWCOMER_EVERY:g} s",
    }
    return (
        " Issue #39's crowds, from 30 s (the first 30 s are the healthy tenant alone): "
        + "; ".join(words[c] for c in crowds)
        + "."
    )


def crowd_rows(r: dict[str, Any], latencies: dict[str, list[float]]) -> list[str]:
    """The report's rows for issue #39's goals: the healthy tenant beside the crowds, against it alone."""
    alone, beside = latencies["GetMetrics calm"], latencies["GetMetrics attacked"]
    if not alone or not beside:
        return ["| healthy GetMetrics p99 alone / beside the crowds | no calls | |"]
    alone_ms, beside_ms = 1000 * percentile(alone, 99), 1000 * percentile(beside, 99)
    goal_ms = max(P99_FLOOR_MS, 10 * alone_ms)
    wakes = r.get("wakes", {})
    alone_wakes, worst_wake = wakes.get("calm", []), max(wakes.get("attacked", []), default=float("inf"))
    newcomers = dict(r.get("newcomers", {}))
    refused = sum(n for code, n in newcomers.items() if code != "OK")
    why = f"; `{r['newcomer_error']}`" if "newcomer_error" in r else ""
    return [
        f"| healthy GetMetrics alone (first 30 s) | {len(alone)} calls, p99 {alone_ms:.1f} ms | |",
        f"| healthy GetMetrics beside the crowds | {len(beside)} calls, p99 {beside_ms:.1f} ms |"
        f" ≤ max(50, 10 × alone) = {goal_ms:.0f} ms: {met(beside_ms <= goal_ms, f'{beside_ms - goal_ms:.0f} ms')} |",
        f"| healthy `pending` wake alone (first 30 s) | {len(alone_wakes)} wakes, max"
        f" {max(alone_wakes, default=float('nan')):.2f} s | |",
        f"| healthy `pending` wake beside the crowds | {len(wakes.get('attacked', []))} wakes, max {worst_wake:.2f} s |"
        f" ≤ {WAKE_GOAL:g} s: {met(worst_wake <= WAKE_GOAL, f'{worst_wake - WAKE_GOAL:.2f} s')} |",
        f"| new namespaces' new ScaledObjects (GetMetricSpec every {NEWCOMER_EVERY:g} s) | {newcomers}{why} |"
        f" always served: {met(bool(newcomers) and refused == 0, f'{refused} refused')} |",
        f"| the scaler's CPU (all threads, share of one core), alone / beside the crowds |"
        f" {' / '.join(f'{share:.0f} %' for share in r.get('cpu_percent', []))} | |",
        f"| followed ScaledObjects, peak (gauge) | {r.get('followed_max', float('nan')):.0f} | |",
        f"| /metrics reads (every second) failed, alone / beside the crowds | {dict(r.get('metrics_failed', {})) or 'none'} | |",
        f"| models crowd's answers | {r.get('crowd_models', 'not run')} | |",
        f"| flood crowd's answers | {r.get('crowd_flood', 'not run')} | |",
    ]


def met(ok: bool, by: str) -> str:
    return "met" if ok else f"missed by {by}"
