"""What a caller can make the scaler hold has a bound: notes and their log lines, /metrics series."""

from __future__ import annotations

import logging

import aiohttp
import grpc
import pytest
from support import GpuLine, dcgm_page, eventually

from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb
from keda_gpu_scaler.server.registry import MAX_NOTES_LOGGED, MAX_NOTES_REMEMBERED
from keda_gpu_scaler.telemetry import MAX_PUBLISHED_TRIGGERS


def ref(name: str, metadata: dict[str, str]) -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name=name, namespace="llm", scalerMetadata=metadata)


async def test_a_new_pod_name_prefix_on_every_call_keeps_notes_and_log_bounded(
    make_exporter, make_scaler, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    exporter = await make_exporter(dcgm_page([GpuLine("llm", "vllm-0", 50)]))
    scaler = await make_scaler(exporter)
    first = {"podNamePrefix": "vllm-", "threshold": "60"}

    async def fresh() -> None:
        await scaler.stub.IsActive(ref("chat", first))

    await eventually(fresh)
    caplog.set_level(logging.INFO, logger="keda_gpu_scaler.server.registry")
    calls = 3 * MAX_NOTES_REMEMBERED
    for i in range(calls):
        # Each prefix matches no pod of the namespace: a new note ("matches none of …") every time.
        await scaler.stub.IsActive(ref("chat", {"podNamePrefix": f"x{i}-", "threshold": "60"}))
    followed = scaler.app.registry.get("llm", "chat")
    assert followed is not None and followed.notes_new == calls
    assert len(followed.notes_logged) == MAX_NOTES_REMEMBERED
    lines = [
        r for r in caplog.records if r.name == "keda_gpu_scaler.server.registry" and r.levelno >= logging.INFO
    ]
    assert len(lines) == MAX_NOTES_LOGGED + 1
    assert "further ones are not logged" in lines[-1].getMessage()


async def test_a_scaledobject_shows_a_bounded_number_of_triggers_on_metrics(
    make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    exporter = await make_exporter(dcgm_page([GpuLine("llm", "vllm-0", 50)]))
    scaler = await make_scaler(exporter)
    names = [f"gpu-{i}" for i in range(16)]

    async def answered(so: str, metric: str) -> None:
        metadata = {"podNamePrefix": "vllm-", "threshold": "60", "metricName": metric}
        request = pb.GetMetricsRequest(scaledObjectRef=ref(so, metadata), metricName=metric)
        assert (await scaler.stub.GetMetrics(request)).metricValues[0].metricValueFloat == 50

    for so in ("a", "b", "c"):
        for metric in names:
            try:
                await answered(so, metric)
            except grpc.aio.AioRpcError:
                await eventually(lambda so=so, metric=metric: answered(so, metric))
    async with aiohttp.ClientSession() as session, session.get(f"{scaler.http}/metrics") as response:
        text = await response.text()
    values = [line for line in text.splitlines() if line.startswith("keda_gpu_scaler_trigger_value{")]
    for so in ("a", "b", "c"):
        shown = [line for line in values if f'scaledobject="{so}"' in line]
        assert len(shown) == MAX_PUBLISHED_TRIGGERS, shown
    unpublished = next(
        line for line in text.splitlines() if line.startswith("keda_gpu_scaler_triggers_unpublished_total ")
    )
    assert float(unpublished.split()[1]) >= 3 * (len(names) - MAX_PUBLISHED_TRIGGERS)
