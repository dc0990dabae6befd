"""/explain under a crowd of clients, through the real HTTP server: over its limits a client is told at
once to come back later (429 with Retry-After); gRPC answers go on."""

from __future__ import annotations

import asyncio

import aiohttp
from support import GpuLine, dcgm_page, eventually

from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb

PODS = 6000  # an answer of this size costs far more than the budget allows several times over
REF = pb.ScaledObjectRef(
    name="big", namespace="llm", scalerMetadata={"podNamePrefix": "vllm-", "threshold": "60"}
)


async def test_a_crowd_of_explain_clients_gets_429_quickly_and_grpc_goes_on(
    make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    exporter = await make_exporter(dcgm_page([GpuLine("llm", f"vllm-{i}", 50, gpu=i) for i in range(PODS)]))
    # A 6,000-GPU page scraped every 0.2 s beside the admitted answers' work: on a loaded two-core CI
    # machine a scrape can come late. Data staleness is not what this test is about: allow 5 s.
    scaler = await make_scaler(exporter, max_staleness=5.0)

    async def evaluated() -> None:
        response = await scaler.stub.GetMetrics(
            pb.GetMetricsRequest(scaledObjectRef=REF, metricName="gpu-utilization")
        )
        assert response.metricValues[0].metricValueFloat > 0

    await eventually(evaluated)
    params = {"namespace": "llm", "name": "big"}
    async with aiohttp.ClientSession() as session:

        async def ask() -> tuple[int, str | None, int]:
            async with session.get(f"{scaler.http}/explain", params=params) as response:
                body = await response.read()
                return response.status, response.headers.get("Retry-After"), len(body)

        answers = await asyncio.gather(*(ask() for _ in range(16)))
        statuses = sorted(status for status, _, _ in answers)
        assert statuses[0] == 200 and statuses[-1] == 429, statuses
        assert set(statuses) == {200, 429}, statuses
        for status, retry_after, size in answers:
            if status == 429:
                assert retry_after is not None and int(retry_after) >= 1
            else:
                assert size > PODS * 50  # the whole answer, every pod listed
        # The scaler kept answering gRPC calls meanwhile, and /explain answers again once the budget is back.
        await evaluated()

        async def answered_again() -> None:
            status, _, _ = await ask()
            assert status == 200, status

        await eventually(answered_again, interval=0.5)
