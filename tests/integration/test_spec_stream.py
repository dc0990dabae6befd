"""StreamMetricSpec (KEDA v2.21) over real gRPC on loopback: the specs at once, then each change of target."""

from __future__ import annotations

import asyncio

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support import eventually

from keda_gpu_scaler.core.trigger_parse import parse_trigger
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb
from keda_gpu_scaler.server.spec_targets import SPEC_UPDATE_INTERVAL

METADATA = {"podNamePrefix": "vllm-", "threshold": "70", "scalerAddress": "keda-gpu-scaler.keda:6000"}
SPEC = parse_trigger(METADATA)


def ref(name: str = "vllm") -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name=name, namespace="llm", scalerMetadata=METADATA)


class Clock:
    """A clock the test moves, counting its reads (each round of an open stream reads it)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


def targets_of(scaler):  # type: ignore[no-untyped-def]
    followed = scaler.app.registry.get("llm", "vllm")
    assert followed is not None
    return followed.targets


def sent(scaler, reason: str) -> float:  # type: ignore[no-untyped-def]
    return float(scaler.app.telemetry.spec_updates.labels(reason)._value.get())


def open_spec_streams(scaler) -> float:  # type: ignore[no-untyped-def]
    return float(scaler.app.telemetry.open_spec_streams._value.get())


class Reader:
    """Collects every message of one stream in the background."""

    def __init__(self, stream) -> None:  # type: ignore[no-untyped-def]
        self.stream = stream
        self.targets: list[float] = []
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self.stream:
            assert len(message.metricSpecs) == 1, message
            self.targets.append(message.metricSpecs[0].targetSizeFloat)

    async def has(self, expected: list[float]) -> None:
        async def check() -> None:
            assert self.targets == expected

        await eventually(check)


async def several_rounds_pass(clock: Clock) -> None:
    """Wait (polling, no sleep for the event itself) until the open stream has looked several times more."""
    start = clock.reads

    async def check() -> None:
        assert clock.reads >= start + 10

    await eventually(check)


async def test_first_message_is_what_get_metric_spec_answers_and_is_sent_once(make_scaler) -> None:  # type: ignore[no-untyped-def]
    clock = Clock()
    scaler = await make_scaler(clock=clock)
    reader = Reader(scaler.stub.StreamMetricSpec(ref()))
    await reader.has([70.0])
    first = await scaler.stub.GetMetricSpec(ref())
    assert first.metricSpecs[0].targetSizeFloat == 70.0 and first.metricSpecs[0].targetSize == 70
    assert first.metricSpecs[0].metricName == "gpu-utilization"
    await several_rounds_pass(clock)  # unchanged target: nothing more, never an empty list
    assert reader.targets == [70.0]
    async with aiohttp.ClientSession() as session, session.get(f"{scaler.http}/metrics") as response:
        text = await response.text()
    assert "keda_gpu_scaler_open_spec_streams 1.0" in text
    assert 'keda_gpu_scaler_spec_updates_total{reason="open"} 1.0' in text
    reader.stream.cancel()

    async def closed() -> None:
        assert open_spec_streams(scaler) == 0

    await eventually(closed)


async def test_a_changed_target_is_sent_once_and_at_most_once_a_minute(make_scaler) -> None:  # type: ignore[no-untyped-def]
    clock = Clock()
    scaler = await make_scaler(clock=clock)
    reader = Reader(scaler.stub.StreamMetricSpec(ref()))
    await reader.has([70.0])
    targets = targets_of(scaler)
    targets.set(SPEC, 80.5)  # the first move goes at once
    await reader.has([70.0, 80.5])
    answer = (await scaler.stub.GetMetricSpec(ref())).metricSpecs[0]
    assert (answer.targetSizeFloat, answer.targetSize) == (80.5, 81)

    clock.now += SPEC_UPDATE_INTERVAL / 2
    targets.set(SPEC, 90.0)
    targets.set(SPEC, 95.0)
    await several_rounds_pass(clock)
    assert reader.targets == [70.0, 80.5]  # within the minute: held back
    assert (await scaler.stub.GetMetricSpec(ref())).metricSpecs[0].targetSizeFloat == 80.5  # = last streamed

    clock.now += SPEC_UPDATE_INTERVAL / 2
    await reader.has([70.0, 80.5, 95.0])  # the minute is up: the latest move, once
    assert (await scaler.stub.GetMetricSpec(ref())).metricSpecs[0].targetSizeFloat == 95.0
    clock.now += SPEC_UPDATE_INTERVAL
    targets.set(SPEC, 95.0)  # the same target again: nothing to send
    await several_rounds_pass(clock)
    assert reader.targets == [70.0, 80.5, 95.0]
    assert (sent(scaler, "open"), sent(scaler, "change")) == (1, 2)
    reader.stream.cancel()


async def test_invalid_metadata_on_open_is_what_get_metric_spec_answers(make_scaler) -> None:  # type: ignore[no-untyped-def]
    scaler = await make_scaler()
    bad = pb.ScaledObjectRef(
        name="vllm", namespace="llm", scalerMetadata={"threshold": "-3", "podNamePrefix": "v"}
    )
    with pytest.raises(grpc.aio.AioRpcError) as unary:
        await scaler.stub.GetMetricSpec(bad)
    with pytest.raises(grpc.aio.AioRpcError) as streamed:
        await scaler.stub.StreamMetricSpec(bad).read()
    assert unary.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert (streamed.value.code(), streamed.value.details()) == (unary.value.code(), unary.value.details())


async def test_spec_streams_are_bounded_by_max_streams_apart_from_activity_streams(make_scaler) -> None:  # type: ignore[no-untyped-def]
    scaler = await make_scaler(max_streams=1)
    first = scaler.stub.StreamMetricSpec(ref())
    await asyncio.wait_for(first.read(), 10)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await scaler.stub.StreamMetricSpec(ref()).read()
    assert raised.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "StreamMetricSpec" in (raised.value.details() or "") and "--max-streams" in (
        raised.value.details() or ""
    )
    activity = scaler.stub.StreamIsActive(ref())  # KEDA opens one of each per trigger: each has its own bound

    async def both_open() -> None:
        assert scaler.app.service.open_streams == 1 and open_spec_streams(scaler) == 1

    await eventually(both_open)
    for stream in (first, activity):
        stream.cancel()


async def test_5000_abandoned_streams_leave_the_server_healthy_and_none_open(make_scaler) -> None:  # type: ignore[no-untyped-def]
    scaler = await make_scaler()
    for batch in range(20):
        streams = [scaler.stub.StreamMetricSpec(ref(f"vllm-{batch}-{i % 5}")) for i in range(250)]
        # Half are read first (their handler runs on the server), half dropped at once.
        await asyncio.gather(*(asyncio.wait_for(s.read(), 30) for s in streams[::2]))
        for stream in streams:
            stream.cancel()

    async def none_open() -> None:
        assert open_spec_streams(scaler) == 0

    await eventually(none_open, timeout=30)
    assert sent(scaler, "open") >= 2500
    assert (await scaler.stub.GetMetricSpec(ref())).metricSpecs[0].targetSizeFloat == 70.0
    health = health_pb2_grpc.HealthStub(scaler.channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(service="readiness"))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    fresh = scaler.stub.StreamMetricSpec(ref())
    assert (await asyncio.wait_for(fresh.read(), 10)).metricSpecs[0].targetSizeFloat == 70.0
    fresh.cancel()


async def test_shutdown_ends_spec_streams_with_ok(make_scaler) -> None:  # type: ignore[no-untyped-def]
    scaler = await make_scaler()
    stream = scaler.stub.StreamMetricSpec(ref())
    assert (await asyncio.wait_for(stream.read(), 10)).metricSpecs[0].targetSizeFloat == 70.0
    stopping = asyncio.create_task(scaler.app.stop())
    assert await asyncio.wait_for(stream.read(), 10) is grpc.aio.EOF
    assert await stream.code() is grpc.StatusCode.OK
    await asyncio.wait_for(stopping, 10)
    assert open_spec_streams(scaler) == 0


async def test_a_shutdown_while_a_message_is_being_sent_ends_the_stream_at_once(make_scaler) -> None:  # type: ignore[no-untyped-def]
    """No waiter is there to wake while the stream is at its `yield` (gRPC sending the message): it must
    still end at once, not a recheck (--scrape-interval) later."""
    scaler = await make_scaler(scrape_interval=30.0, max_staleness=90.0)  # recheck = scrape interval
    service = scaler.app.service
    stream = service.StreamMetricSpec(ref(), None)  # the handler gRPC runs, driven directly
    assert (await stream.__anext__()).metricSpecs[0].targetSizeFloat == 70.0  # suspended at its yield
    service.close_streams()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(stream.__anext__(), 2.0)


async def test_a_stream_whose_scaledobject_was_forgotten_for_another_namespace_ends(make_scaler) -> None:  # type: ignore[no-untyped-def]
    """Forgotten while its stream is open (the --max-scaledobjects fair share gave its room to another
    namespace), with no room to follow it again: the stream ends with RESOURCE_EXHAUSTED, freeing its
    --max-streams place. Kept open, such streams held every place, and another namespace got none."""
    scaler = await make_scaler(
        scrape_interval=30.0, max_staleness=90.0, max_scaledobjects=2, shutdown_grace=3.0
    )
    stream = scaler.stub.StreamMetricSpec(ref())
    assert (await asyncio.wait_for(stream.read(), 10)).metricSpecs[0].targetSizeFloat == 70.0
    other = pb.ScaledObjectRef(name="other", namespace="llm", scalerMetadata=METADATA)
    await scaler.stub.GetMetricSpec(other)  # llm holds the cap of 2
    await scaler.stub.GetMetricSpec(pb.ScaledObjectRef(name="x", namespace="b", scalerMetadata=METADATA))
    assert scaler.app.registry.get("llm", "vllm") is None  # b below its share: llm's least recent went
    with pytest.raises(grpc.aio.AioRpcError) as ended:
        await asyncio.wait_for(stream.read(), 10)
    assert ended.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_an_open_spec_stream_keeps_its_scaledobject_and_target_past_the_interest_ttl(
    make_scaler,
) -> None:  # type: ignore[no-untyped-def]
    """A stream follows its ScaledObject again only at its recheck (--scrape-interval, here 3 s); with an
    --interest-ttl of 1 s the sweep forgot it between rounds: its learned target was lost and the stream
    sent the start threshold again within seconds of the move."""
    scaler = await make_scaler(scrape_interval=3.0, max_staleness=9.0, interest_ttl=1.0)
    stream = scaler.stub.StreamMetricSpec(ref())
    assert (await asyncio.wait_for(stream.read(), 10)).metricSpecs[0].targetSizeFloat == 70.0
    targets_of(scaler).set(SPEC, 80.5)  # a learned target's first move: published at once
    assert (await asyncio.wait_for(stream.read(), 10)).metricSpecs[0].targetSizeFloat == 80.5
    with pytest.raises(asyncio.TimeoutError):  # nothing more: not forgotten, nothing sent again
        await asyncio.wait_for(stream.read(), 2.5)
    assert (await scaler.stub.GetMetricSpec(ref())).metricSpecs[0].targetSizeFloat == 80.5
    stream.cancel()
    await eventually(lambda: _gone_after_ttl(scaler))  # closed, it is idle again: the TTL ends it


async def _gone_after_ttl(scaler) -> None:  # type: ignore[no-untyped-def]
    assert scaler.app.registry.get("llm", "vllm") is None


@pytest.mark.parametrize("method", ["StreamMetricSpec", "StreamIsActive"])
async def test_a_scaledobject_with_an_open_stream_is_not_idle_at_the_cap(make_scaler, method: str) -> None:  # type: ignore[no-untyped-def]
    """At the cap, a ScaledObject not called for a minute makes room; one whose stream is open (following
    it again only every --scrape-interval, 90 s here) is called, not idle: the newcomer is refused."""
    clock = Clock()
    scaler = await make_scaler(clock=clock, scrape_interval=90.0, max_staleness=270.0, max_scaledobjects=1)
    stream = getattr(scaler.stub, method)(ref())
    if method == "StreamMetricSpec":
        await asyncio.wait_for(stream.read(), 10)  # sent once counted open
    else:

        async def opened() -> None:  # counted open in the same turn of the loop as the slot is taken
            assert scaler.app.service.open_streams == 1

        await eventually(opened)
    followed = scaler.app.registry.get("llm", "vllm")
    assert followed is not None
    clock.now += 61
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await scaler.stub.GetMetricSpec(ref("other"))
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert scaler.app.registry.get("llm", "vllm") is followed
    stream.cancel()
    await eventually(lambda: _closed(followed))
    await scaler.stub.GetMetricSpec(ref("other"))  # its stream closed, it is idle: room is made
    assert scaler.app.registry.get("llm", "vllm") is None


async def _closed(followed) -> None:  # type: ignore[no-untyped-def]
    assert not followed.streamed()
