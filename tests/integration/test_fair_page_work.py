"""The page worker threads are shared fairly between namespaces, through the real scaler and real pages:
one tenant's large pod pages (each over 256 kB is joined, screened and read in a worker thread, 1 s of
parsing at 20,000 series) never hold another's GPU exporter page there long enough to make it stale.
Before (one FIFO queue for every namespace), the exporter's data went stale while six such pages were
read."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from support import GpuLine, dcgm_page, eventually

from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb

HOSTILE_PODS = 6

# The 15 MB pages are served by another process: serving them from the test's loop would slow the scaler.
SERVER = textwrap.dedent(
    """
    import functools, http.server, sys
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[1])
    handler.func.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()
    """
)


def hostile_page() -> bytes:
    """A legal inference page: 20,000 series of a wanted family (the per-page limit), ~15 MB (< 16 MiB)."""
    lines = [
        f'vllm:num_requests_waiting{{model_name="m",engine="{i}",x="{"a" * 700}{i}"}} 1\n'
        for i in range(19_999)
    ]
    lines.append('vllm:num_requests_running{model_name="m",engine="0"} 1\n')
    return "".join(lines).encode()


def victim_page() -> str:
    """A GPU exporter page a bit over 256 kB (so read in a worker thread): one pod's GPU, and series of
    families no trigger reads."""
    page = dcgm_page([GpuLine("llm", "chat-0", 60)])
    extra = "".join(
        f'DCGM_FI_DEV_SM_CLOCK{{gpu="{i}",UUID="GPU-{i:032d}",Hostname="gpu-node-a"}} 1410\n'
        for i in range(4000)
    )
    return page + extra


@pytest.fixture
async def hostile_server(tmp_path: Path) -> AsyncIterator[str]:
    body = hostile_page()
    for i in range(HOSTILE_PODS):
        (tmp_path / f"p{i}.txt").write_bytes(body)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SERVER, str(tmp_path), stdout=subprocess.PIPE
    )
    assert process.stdout is not None
    port = int((await process.stdout.readline()).decode())
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    await process.wait()


def victim() -> pb.ScaledObjectRef:
    metadata = {"metric": "utilization", "threshold": "50", "podNamePrefix": "chat-"}
    return pb.ScaledObjectRef(name="gpu", namespace="llm", scalerMetadata=metadata)


def hostile() -> pb.ScaledObjectRef:
    metadata = {"metric": "requests", "threshold": "10", "podNamePrefix": "hostile-"}
    return pb.ScaledObjectRef(name="big", namespace="hostile", scalerMetadata=metadata)


async def unavailable_share(scaler, seconds: float) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    failed = calls = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        calls += 1
        try:
            await scaler.stub.GetMetrics(
                pb.GetMetricsRequest(scaledObjectRef=victim(), metricName="gpu-utilization")
            )
        except grpc.aio.AioRpcError as error:
            assert error.code() is grpc.StatusCode.UNAVAILABLE, error
            failed += 1
        await asyncio.sleep(0.1)
    return failed, calls


async def run(make_exporter, make_scaler, hostile_server: str, *, attack: bool) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    exporter = await make_exporter(victim_page())
    scaler = await make_scaler(
        exporter,
        inference_urls=tuple(
            ("hostile", f"hostile-{i}", f"{hostile_server}/p{i}.txt") for i in range(HOSTILE_PODS)
        ),
        scrape_interval=0.5,
        max_staleness=2.0,
        scrape_timeout=5.0,
    )
    request = pb.GetMetricsRequest(scaledObjectRef=victim(), metricName="gpu-utilization")
    answer = await eventually(lambda: scaler.stub.GetMetrics(request))
    assert answer.metricValues[0].metricValueFloat == 60
    if attack:
        # The hostile tenant's ScaledObject is followed: its pods' pages are wanted from now on.
        with contextlib.suppress(grpc.aio.AioRpcError):
            await scaler.stub.GetMetrics(
                pb.GetMetricsRequest(scaledObjectRef=hostile(), metricName="inference-requests")
            )
        await asyncio.sleep(2.0)
    return await unavailable_share(scaler, 10.0)


async def test_another_tenants_large_pages_never_make_the_gpu_exporter_stale(
    hostile_server: str, make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    failed, calls = await run(make_exporter, make_scaler, hostile_server, attack=True)
    assert failed == 0, (
        f"{failed} of {calls} GetMetrics of namespace llm were UNAVAILABLE (its exporter's page went stale)"
    )


async def test_control_without_the_hostile_tenant_the_exporter_stays_fresh(
    hostile_server: str, make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    failed, calls = await run(make_exporter, make_scaler, hostile_server, attack=False)
    assert failed == 0, f"{failed} of {calls}"
