"""`keda-gpu-scaler demo`: the scaler plus the simulated fleet, a banner of commands to try, a live status."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import sys
from typing import TextIO

import grpc

from keda_gpu_scaler._proto import externalscaler_pb2 as pb
from keda_gpu_scaler._proto import externalscaler_pb2_grpc as pb_grpc
from keda_gpu_scaler.app import App, run_until_signalled
from keda_gpu_scaler.demo import DemoFleet, DemoWorkload
from keda_gpu_scaler.settings import Settings

DEMO_THRESHOLD = "60"


def demo_metadata(workload: DemoWorkload) -> dict[str, str]:
    return {"podNamePrefix": f"{workload.name}-", "threshold": DEMO_THRESHOLD, "activationThreshold": "5"}


def banner(fleet: DemoFleet, grpc_port: int, http_port: int) -> str:
    grpcurl = shutil.which("grpcurl") or "grpcurl"
    target = f"127.0.0.1:{grpc_port}"
    workload = fleet.workloads[0]
    ref = {"name": workload.name, "namespace": fleet.NAMESPACE, "scalerMetadata": demo_metadata(workload)}
    ref_json = json.dumps(ref, separators=(",", ":"))
    metrics_json = json.dumps(
        {"scaledObjectRef": ref, "metricName": "gpu-utilization"}, separators=(",", ":")
    )
    pod = workload.pods[0]
    lines = [
        "",
        "keda-gpu-scaler demo: a simulated GPU fleet on loopback, scraped by the scaler.",
        f"  gRPC (KEDA's side)  {target}        HTTP  http://127.0.0.1:{http_port}/metrics",
        "  workloads (namespace demo): "
        + ", ".join(
            f"{w.name} ({w.vendor}, {len(w.pods)} pods x {w.gpus_per_pod} GPU)" for w in fleet.workloads
        ),
        "",
        "Try, in another terminal:",
        f"  {grpcurl} -plaintext {target} list",
        f"  {grpcurl} -plaintext -d '{ref_json}' {target} externalscaler.ExternalScaler/GetMetricSpec",
        f"  {grpcurl} -plaintext -d '{metrics_json}' {target} externalscaler.ExternalScaler/GetMetrics",
        f"  {grpcurl} -plaintext -d '{ref_json}' {target} externalscaler.ExternalScaler/IsActive",
        f"  {grpcurl} -plaintext -d '{ref_json}' {target} externalscaler.ExternalScaler/StreamIsActive",
        f"  curl 'http://127.0.0.1:{http_port}/explain?namespace={fleet.NAMESPACE}&name={workload.name}'",
        f"  curl '{fleet.control_url}/load?pod={pod}&value=95'     # pin a pod's GPU load ('auto' to release)",
        "",
        "Status below: value = Σ per-pod GPU % (what KEDA's default AverageValue needs), threshold"
        f" {DEMO_THRESHOLD} per pod.",
        "",
    ]
    return "\n".join(lines)


async def watch(app: App, fleet: DemoFleet, interval: float, out: TextIO) -> None:
    """Print one status line per workload, asking the scaler through its own gRPC API as KEDA would."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        stub = pb_grpc.ExternalScalerStub(channel)
        # As KEDA does: GetMetricSpec first (it starts collection), so the first status line has data.
        for workload in fleet.workloads:
            await stub.GetMetricSpec(
                pb.ScaledObjectRef(
                    name=workload.name, namespace=fleet.NAMESPACE, scalerMetadata=demo_metadata(workload)
                )
            )
        await asyncio.sleep(min(interval, 1.0))
        while True:
            for workload in fleet.workloads:
                ref = pb.ScaledObjectRef(
                    name=workload.name, namespace=fleet.NAMESPACE, scalerMetadata=demo_metadata(workload)
                )
                try:
                    metrics = await stub.GetMetrics(
                        pb.GetMetricsRequest(scaledObjectRef=ref, metricName="gpu-utilization")
                    )
                    active = await stub.IsActive(ref)
                    value = metrics.metricValues[0].metricValueFloat
                    explanation = app.explanation(fleet.NAMESPACE, workload.name)
                    what_if = explanation.evaluation.what_if if explanation and explanation.evaluation else None
                    wants = (
                        f"HPA wants {what_if.average_value if what_if else '?'}"
                        if active.result
                        else "idle: KEDA scales to minReplicaCount after cooldownPeriod"
                    )
                    line = (
                        f"{workload.name:<12} value {value:7.1f}  active {str(active.result).lower():<5}"
                        f"  pods {what_if.current_replicas if what_if else '?'}  → {wants}"
                    )
                except grpc.aio.AioRpcError as error:
                    line = f"{workload.name:<12} {error.code().name}: {error.details()}"
                print(line, file=out, flush=True)
            print(file=out, flush=True)
            await asyncio.sleep(interval)


async def run_demo(settings: Settings, *, control_port: int, watch_interval: float) -> None:
    fleet = DemoFleet()
    await fleet.start(control_port=control_port)
    try:
        # The demo is local and for learning: /explain is on (it is off by default in `serve`).
        app = App(dataclasses.replace(settings, exporter_urls=tuple(fleet.exporter_urls), explain=True))

        async def after_start() -> None:
            print(banner(fleet, app.grpc_port, app.http_port), file=sys.stdout, flush=True)
            if watch_interval > 0:
                await watch(app, fleet, watch_interval, sys.stdout)

        await run_until_signalled(app, after_start)
    finally:
        await fleet.stop()
