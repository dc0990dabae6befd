"""A StreamIsActive client that freezes (half-open connection) gives its stream slot back."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap

from support import GpuLine, dcgm_page, eventually

# A client in its own process: SIGSTOP freezes it the way a lost node or a hung peer looks to the server
# (the kernel still acknowledges TCP, but nobody answers HTTP/2 pings).
CLIENT = textwrap.dedent(
    """
    import sys, grpc
    from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb, externalscaler_pb2_grpc as pb_grpc
    channel = grpc.insecure_channel(sys.argv[1])
    stub = pb_grpc.ExternalScalerStub(channel)
    ref = pb.ScaledObjectRef(name="vllm", namespace="llm",
                             scalerMetadata={"podNamePrefix": "vllm-", "threshold": "70"})
    stream = stub.StreamIsActive(ref)
    print("open", flush=True)
    for _ in stream:
        pass
    """
)


async def test_a_frozen_stream_client_is_dropped_by_keepalive(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    exporter = await make_exporter(dcgm_page([GpuLine("llm", "vllm-0", 90)]))
    scaler = await make_scaler(exporter, keepalive_time=0.3, keepalive_timeout=0.5, max_streams=1)
    client = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CLIENT, scaler.target, stdout=asyncio.subprocess.PIPE, env=dict(os.environ)
    )
    try:
        assert client.stdout is not None
        assert (await asyncio.wait_for(client.stdout.readline(), 20)).strip() == b"open"

        async def stream_open() -> None:
            assert scaler.app.service.open_streams == 1

        await eventually(stream_open)
        client.send_signal(signal.SIGSTOP)

        async def slot_freed() -> None:
            assert scaler.app.service.open_streams == 0

        await eventually(slot_freed, timeout=20)
    finally:
        if client.returncode is None:
            client.kill()
        await client.wait()
