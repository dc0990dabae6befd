"""A call refused for any reason (a stream over --max-streams, an unknown metric name) changes nothing another
call sees: it follows no ScaledObject, so at --max-scaledobjects it makes no other one go."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from keda_gpu_scaler.core.trigger_parse import parse_trigger
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb

METADATA = {"podNamePrefix": "vllm-", "threshold": "70"}
SPEC = parse_trigger(METADATA)


def ref(namespace: str, name: str) -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name=name, namespace=namespace, scalerMetadata=METADATA)


async def target(scaler, namespace: str, name: str) -> float:  # type: ignore[no-untyped-def]
    return (await scaler.stub.GetMetricSpec(ref(namespace, name))).metricSpecs[0].targetSizeFloat


async def test_a_refused_spec_stream_evicts_no_other_scaledobject(make_scaler) -> None:  # type: ignore[no-untyped-def]
    scaler = await make_scaler(max_streams=1, max_scaledobjects=2)
    assert await target(scaler, "a", "x1") == 70
    assert await target(scaler, "a", "x2") == 70
    # x2's target moved at run time (the seam `threshold: auto` publishes through): GetMetricSpec answers it.
    scaler.app.registry.get("a", "x2").targets.set(SPEC, 80.5)
    assert await target(scaler, "a", "x2") == 80.5
    held = scaler.stub.StreamMetricSpec(ref("a", "x1"))  # the one stream --max-streams allows
    assert (await asyncio.wait_for(held.read(), 10)).metricSpecs[0].targetSizeFloat == 70

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await asyncio.wait_for(scaler.stub.StreamMetricSpec(ref("b", "y")).read(), 10)
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED

    # Another namespace's ScaledObject keeps what GetMetricSpec answered (it was forgotten: back at 70)...
    assert scaler.app.registry.get("a", "x2") is not None, "a/x2 was forgotten by b's refused call"
    assert await target(scaler, "a", "x2") == 80.5
    # ...and the refused call follows nothing (it holds a --max-scaledobjects place for --interest-ttl).
    assert scaler.app.registry.get("b", "y") is None, "the refused stream's ScaledObject is followed"
    held.cancel()


async def test_a_get_metrics_refused_not_found_evicts_no_other_scaledobject(make_scaler) -> None:  # type: ignore[no-untyped-def]
    """The same pattern on GetMetrics: an unknown metric name (NOT_FOUND) is decided after following."""
    scaler = await make_scaler(max_scaledobjects=2)
    assert await target(scaler, "a", "x1") == 70
    assert await target(scaler, "a", "x2") == 70
    scaler.app.registry.get("a", "x2").targets.set(SPEC, 80.5)
    assert await target(scaler, "a", "x2") == 80.5
    assert await target(scaler, "a", "x1") == 70  # x2 is now a's least recently called
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await scaler.stub.GetMetrics(
            pb.GetMetricsRequest(scaledObjectRef=ref("b", "y"), metricName="no-such")
        )
    assert refused.value.code() is grpc.StatusCode.NOT_FOUND
    assert scaler.app.registry.get("a", "x2") is not None, "a/x2 was forgotten by b's refused call"
    assert await target(scaler, "a", "x2") == 80.5
