"""`keda-gpu-scaler demo`: the scaler plus the simulated fleet, a banner of commands to try, a live status."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path
from typing import TextIO

import grpc

from keda_gpu_scaler.app import App, run_until_signalled
from keda_gpu_scaler.config.settings import Settings, SettingsError
from keda_gpu_scaler.core.recommended import GUARD, llm_summary
from keda_gpu_scaler.demo.fleet import DemoFleet
from keda_gpu_scaler.demo.gateway import DemoPool
from keda_gpu_scaler.demo.layout import DemoInferenceWorkload, DemoWorkload
from keda_gpu_scaler.explain import counted
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb
from keda_gpu_scaler.externalscaler import externalscaler_pb2_grpc as pb_grpc

DEMO_THRESHOLD = "60"
# Target concurrency per pod of the inference workloads' `requests` triggers.
INFERENCE_THRESHOLD = "16"
GPU_METRIC_NAME = "gpu-utilization"
REQUESTS_METRIC_NAME = "inference-requests"
# Requests per second one replica of the demo's vLLM workloads should serve (its `demand` trigger).
DEMAND_THRESHOLD = "2"
DEMAND_METRIC_NAME = "inference-demand"
PENDING_METRIC_NAME = "gateway-pending"


def demo_metadata(workload: DemoWorkload) -> dict[str, str]:
    return {"podNamePrefix": f"{workload.name}-", "threshold": DEMO_THRESHOLD, "activationThreshold": "5"}


def inference_metadata(workload: DemoInferenceWorkload) -> dict[str, str]:
    """A `requests` trigger: running + waiting per pod, summed, with a target of 16 in flight per pod."""
    return {"metric": "requests", "threshold": INFERENCE_THRESHOLD, "podNamePrefix": f"{workload.name}-"}


def demand_metadata(workload: DemoInferenceWorkload) -> dict[str, str]:
    """A `demand` trigger: requests arriving per second over the pods, sized at 2 a second per replica."""
    return {"metric": "demand", "threshold": DEMAND_THRESHOLD, "podNamePrefix": f"{workload.name}-"}


def pending_metadata(pool: DemoPool) -> dict[str, str]:
    """A `pending` trigger: requests the pool's endpoint pickers hold; one per replica wakes it from zero."""
    return {"metric": "pending", "threshold": "1", "inferencePool": pool.name}


@dataclasses.dataclass(frozen=True)
class DemoTarget:
    """One ScaledObject the demo's status lines ask about, as KEDA would."""

    name: str
    metadata: dict[str, str]
    metric_name: str
    unit: str  # what the value counts, for the status line
    pool: str | None = None  # a `pending` trigger's InferencePool: its status line shows the wake


def demo_targets(fleet: DemoFleet) -> list[DemoTarget]:
    """The GPU workloads' utilisation triggers, then the inference workloads' `demand` triggers (the
    recommended sizing, recommended.SIZING: asked from start-up, so their rates exist when the README's
    Try-it calls come), then the pools' `pending` triggers (the wake)."""
    targets = [DemoTarget(w.name, demo_metadata(w), GPU_METRIC_NAME, "GPU %") for w in fleet.workloads]
    targets += [
        DemoTarget(w.name, demand_metadata(w), DEMAND_METRIC_NAME, "req/s") for w in fleet.inference_workloads
    ]
    targets += [
        DemoTarget(p.workload, pending_metadata(p), PENDING_METRIC_NAME, "pending", p.name)
        for p in fleet.gateway.pools
    ]
    return targets


def demo_settings(settings: Settings, fleet: DemoFleet) -> Settings:
    """The scaler's settings for a started fleet: its exporters, its inference pods' pages, /explain on."""
    # The demo is local and for learning: /explain is on (it is off by default in `serve`).
    return dataclasses.replace(
        settings,
        exporter_urls=tuple(fleet.exporter_urls),
        inference_urls=tuple(fleet.inference_urls),
        gateway_urls=tuple(fleet.gateway_urls),
        explain=True,
    )


def _json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def grpcurl_command() -> str:
    """The grpcurl the banner's commands name: the one `make run` installs beside this interpreter (in
    .venv/bin, often not on the PATH of the terminal they are pasted in), else the PATH's."""
    beside = Path(sys.executable).with_name("grpcurl")
    if beside.is_file():
        return str(beside)
    return shutil.which("grpcurl") or "grpcurl"


def banner(fleet: DemoFleet, grpc_port: int, http_port: int) -> str:
    grpcurl = grpcurl_command()
    target = f"127.0.0.1:{grpc_port}"
    workload = fleet.workloads[0]
    ref = {"name": workload.name, "namespace": fleet.NAMESPACE, "scalerMetadata": demo_metadata(workload)}
    ref_json = _json(ref)
    metrics_json = _json({"scaledObjectRef": ref, "metricName": GPU_METRIC_NAME})
    pod = workload.pods[0]
    lines = [
        "",
        "keda-gpu-scaler demo: a simulated GPU fleet and LLM inference servers on loopback, scraped by the"
        " scaler.",
        f"  gRPC (KEDA's side)  {target}        HTTP  http://127.0.0.1:{http_port}/metrics",
        "  GPU workloads (namespace demo): "
        + ", ".join(
            f"{w.name} ({w.vendor}, {counted(len(w.pods), 'pod')} x {w.gpus_per_pod} GPU)"
            for w in fleet.workloads
        ),
    ]
    if fleet.inference_workloads:
        lines.append(
            "  inference workloads (namespace demo): "
            + ", ".join(
                f"{w.name} ({w.engine} {w.model}, {counted(len(w.pods), 'pod')}, "
                f"{'+'.join(str(n) for n in w.engines_per_pod)} engines)"
                for w in fleet.inference_workloads
            )
        )
    lines += [
        "",
        "Try, in another terminal (-emit-defaults prints 0 and false too):",
        f"  {grpcurl} -plaintext {target} list",
        f"  {grpcurl} -plaintext -d '{ref_json}' {target} externalscaler.ExternalScaler/GetMetricSpec",
        f"  {grpcurl} -plaintext -emit-defaults -d '{metrics_json}' {target}"
        " externalscaler.ExternalScaler/GetMetrics",
        f"  {grpcurl} -plaintext -emit-defaults -d '{ref_json}' {target} externalscaler.ExternalScaler/IsActive",
        f"  {grpcurl} -plaintext -d '{ref_json}' {target} externalscaler.ExternalScaler/StreamIsActive",
        f"  curl 'http://127.0.0.1:{http_port}/explain?namespace={fleet.NAMESPACE}&name={workload.name}'",
        f"  curl '{fleet.control_url}/load?pod={pod}&value=95'     # pin a pod's GPU load ('auto' to release)",
    ]
    if fleet.inference_workloads:
        llm = fleet.inference_workloads[0]
        llm_ref = {"name": llm.name, "namespace": fleet.NAMESPACE, "scalerMetadata": inference_metadata(llm)}
        llm_metrics_json = _json({"scaledObjectRef": llm_ref, "metricName": REQUESTS_METRIC_NAME})
        llm_pod = llm.pods[0]
        demand_ref = {"name": llm.name, "namespace": fleet.NAMESPACE, "scalerMetadata": demand_metadata(llm)}
        demand_json = _json({"scaledObjectRef": demand_ref, "metricName": DEMAND_METRIC_NAME})
        lines += [
            "",
            f"  A `demand` trigger (requests arriving per second, {DEMAND_THRESHOLD} a second per replica) on"
            f" {llm.name}: the sizing signal; its first rate needs two scrapes of each pod",
            f"  {grpcurl} -plaintext -emit-defaults -d '{demand_json}' {target}"
            " externalscaler.ExternalScaler/GetMetrics",
        ]
        lines += [
            "",
            f"  A `requests` trigger (running + waiting per pod) on {llm.name}: the guard beside `demand`, which the"
            f" README sets at {dict(GUARD.metadata)['threshold']}; {INFERENCE_THRESHOLD} here so that the pinned load"
            " below shows it act:",
            f"  {grpcurl} -plaintext -emit-defaults -d '{llm_metrics_json}' {target}"
            " externalscaler.ExternalScaler/GetMetrics",
            f"  curl '{fleet.control_url}/pods/{llm_pod}/metrics'     # the pod's own vLLM page, as scraped",
            f"  curl '{fleet.control_url}/load?pod={llm_pod}&running=12&waiting=30'"
            "     # pin its requests ('value=auto' to release)",
            f"  curl 'http://127.0.0.1:{http_port}/explain?namespace={fleet.NAMESPACE}&name={llm.name}'",
        ]
    for pool in fleet.gateway.pools:
        pending_ref = {
            "name": pool.workload,
            "namespace": fleet.NAMESPACE,
            "scalerMetadata": pending_metadata(pool),
        }
        lines += [
            "",
            f"  Waking from zero: {pool.workload} ({pool.model}) is at 0 replicas behind InferencePool"
            f" {pool.name}, whose endpoint picker queues requests. Open the stream, then queue requests:",
            f"  {grpcurl} -plaintext -d '{_json(pending_ref)}' {target} externalscaler.ExternalScaler/StreamIsActive",
            f"  curl '{fleet.control_url}/load?pool={pool.name}&pending=3'     # the stream says true about a"
            " second later ('pending=0' empties the queue)",
        ]
    lines += [
        f"  curl '{fleet.control_url}/'     # every pod and its load",
        "",
        "Status below: value = Σ per-pod GPU % (what KEDA's default AverageValue needs), threshold"
        f" {DEMO_THRESHOLD} per pod",
    ]
    if fleet.inference_workloads:
        lines.append(
            "  and, for the inference workloads, `demand`: Σ per-pod requests arriving per second,"
            f" threshold {DEMAND_THRESHOLD} a second per replica (the demo's scale)."
        )
        lines.append(f"{llm_summary()}.")
    lines.append("")
    return "\n".join(lines)


def _ref(fleet: DemoFleet, target: DemoTarget) -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name=target.name, namespace=fleet.NAMESPACE, scalerMetadata=target.metadata)


async def status_line(
    app: App,
    fleet: DemoFleet,
    stub: pb_grpc.ExternalScalerStub,
    target: DemoTarget,
    woken_at: float | None = None,
) -> str:
    """One workload's line: the value and activity KEDA would get, and the replicas the HPA would want.

    woken_at: for a `pending` trigger, when its StreamIsActive last sent true (time.monotonic)."""
    ref = _ref(fleet, target)
    try:
        metrics = await stub.GetMetrics(
            pb.GetMetricsRequest(scaledObjectRef=ref, metricName=target.metric_name)
        )
        active = await stub.IsActive(ref)
    except grpc.aio.AioRpcError as error:
        return f"{target.name:<12} {target.unit:<8} {error.code().name}: {error.details()}"
    value = metrics.metricValues[0].metricValueFloat
    if target.pool is not None:
        return _wake_line(fleet, target, value, active.result, woken_at)
    explanation = app.explanation(fleet.NAMESPACE, target.name)
    what_if = explanation.evaluation.what_if if explanation and explanation.evaluation else None
    wants = (
        f"HPA wants {what_if.average_value if what_if else '?'}"
        if active.result
        else "idle: KEDA scales to minReplicaCount after cooldownPeriod"
    )
    return (
        f"{target.name:<12} {target.unit:<8} value {value:7.1f}  active {str(active.result).lower():<5}"
        f"  pods {what_if.current_replicas if what_if else '?'}  → {wants}"
    )


def _wake_line(
    fleet: DemoFleet, target: DemoTarget, value: float, active: bool, woken_at: float | None
) -> str:
    assert target.pool is not None
    queued_at = fleet.gateway.queued_at(target.pool)
    if not active:
        state = "at zero: nothing queued at the gateway"
    elif woken_at is not None and queued_at is not None and woken_at >= queued_at:
        state = f"wake: StreamIsActive sent true {woken_at - queued_at:.1f}s after requests queued → KEDA scales 0 → 1"
    else:
        state = "requests queued: waking"
    return f"{target.name:<12} {target.unit:<8} value {value:7.1f}  active {str(active).lower():<5}  pods 0  → {state}"


async def _stream_wakes(
    stub: pb_grpc.ExternalScalerStub, ref: pb.ScaledObjectRef, wakes: dict[str, float]
) -> None:
    """Keep a StreamIsActive open as KEDA does for an external-push trigger; note when each true arrives."""
    while True:
        try:
            async for response in stub.StreamIsActive(ref):
                if response.result:
                    wakes[ref.name] = time.monotonic()
        except grpc.aio.AioRpcError:
            pass
        await asyncio.sleep(1.0)  # ended (a restart, an error): reopen, as KEDA does


async def watch(app: App, fleet: DemoFleet, interval: float, out: TextIO) -> None:
    """Print one status line per workload, asking the scaler through its own gRPC API as KEDA would."""
    targets = demo_targets(fleet)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        stub = pb_grpc.ExternalScalerStub(channel)
        # As KEDA does: GetMetricSpec first (it starts collection), so the first status line has data.
        for target in targets:
            try:
                await stub.GetMetricSpec(_ref(fleet, target))
            except grpc.aio.AioRpcError as error:
                print(f"{target.name:<12} {error.code().name}: {error.details()}", file=out, flush=True)
        wakes: dict[str, float] = {}
        streams = [
            asyncio.create_task(_stream_wakes(stub, _ref(fleet, t), wakes))
            for t in targets
            if t.pool is not None
        ]
        try:
            await asyncio.sleep(min(interval, 1.0))
            while True:
                for target in targets:
                    line = await status_line(app, fleet, stub, target, wakes.get(target.name))
                    print(line, file=out, flush=True)
                print(file=out, flush=True)
                await asyncio.sleep(interval)
        finally:
            for stream in streams:
                stream.cancel()
            await asyncio.gather(*streams, return_exceptions=True)


async def run_demo(settings: Settings, *, control_port: int, watch_interval: float) -> None:
    fleet = DemoFleet()
    try:
        await fleet.start(control_port=control_port)
    except OSError as error:
        # Most often a demo already runs: one line that says so, as serve says it of its own addresses.
        raise SettingsError(
            f"--control-port {control_port}: cannot listen there ({error.strerror or error}); is another demo"
            " running? Stop it, or give this one other ports (--control-port, --grpc-address, --http-address)"
        ) from None
    try:
        app = App(demo_settings(settings, fleet))

        async def after_start() -> None:
            print(banner(fleet, app.grpc_port, app.http_port), file=sys.stdout, flush=True)
            if watch_interval > 0:
                await watch(app, fleet, watch_interval, sys.stdout)

        await run_until_signalled(app, after_start)
    finally:
        await fleet.stop()
