"""The ExternalScaler gRPC servicer, health and reflection; maps domain errors to gRPC status codes."""

from __future__ import annotations

import functools
import logging
import math
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, NoReturn, TypeVar

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import Gauge

from keda_gpu_scaler.collect.store import Store
from keda_gpu_scaler.core.errors import (
    ConfigError,
    NoData,
    ResourceExhausted,
    ScalerError,
    TooManyStreams,
    UnknownMetric,
    quoted,
)
from keda_gpu_scaler.core.trigger import TriggerSpec
from keda_gpu_scaler.core.trigger_parse import parse_trigger
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb
from keda_gpu_scaler.externalscaler import externalscaler_pb2_grpc as pb_grpc
from keda_gpu_scaler.server.evaluator import Evaluator
from keda_gpu_scaler.server.health import HealthStatus
from keda_gpu_scaler.server.registry import Followed, Registry
from keda_gpu_scaler.telemetry import Telemetry

log = logging.getLogger(__name__)
Message = TypeVar("Message")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ExternalScaler"].full_name
# Looked up along the class hierarchy, so a new subclass of a domain error maps like its parent.
_STATUS_FOR_ERROR: dict[type[Exception], grpc.StatusCode] = {
    ConfigError: grpc.StatusCode.INVALID_ARGUMENT,
    NoData: grpc.StatusCode.UNAVAILABLE,
    UnknownMetric: grpc.StatusCode.NOT_FOUND,
    ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def status_for(error: BaseException) -> grpc.StatusCode:
    """The gRPC status of an error: its nearest mapped class; anything unexpected is INTERNAL."""
    for cls in type(error).__mro__:
        code = _STATUS_FOR_ERROR.get(cls)
        if code is not None:
            return code
    return grpc.StatusCode.INTERNAL


def round_half_up(value: float) -> int:
    # Not floor(value + 0.5): 0.49999999999999994 + 0.5 is 1.0 in floating point.
    whole = math.floor(value)
    return whole + (value - whole >= 0.5)


class ExternalScalerService(pb_grpc.ExternalScalerServicer):
    def __init__(
        self,
        *,
        evaluator: Evaluator,
        registry: Registry,
        store: Store,
        telemetry: Telemetry,
        stream_recheck_seconds: float,
        max_streams: int = 10000,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._evaluator = evaluator
        self._registry = registry
        self._store = store
        self._telemetry = telemetry
        self._stream_recheck = stream_recheck_seconds
        self._clock = clock
        self._closing = False
        self._activity_streams = _StreamSlots("StreamIsActive", max_streams, telemetry.open_streams)
        self._spec_streams = _StreamSlots("StreamMetricSpec", max_streams, telemetry.open_spec_streams)

    @property
    def open_streams(self) -> int:
        return self._activity_streams.open

    def close_streams(self) -> None:
        """End every open stream with status OK (KEDA then reconnects without backoff)."""
        self._closing = True
        self._store.close()
        self._registry.wake_spec_streams()

    @contextmanager
    def _observe(self, method: str) -> Iterator[None]:
        started = self._clock()
        code = grpc.StatusCode.OK
        try:
            yield
        except ScalerError as error:
            code = status_for(error)
            raise
        except Exception:
            code = grpc.StatusCode.INTERNAL
            log.exception("%s failed unexpectedly", method)
            raise _Internal(method) from None
        finally:
            self._telemetry.rpc_requests.labels(method, code.name).inc()
            self._telemetry.rpc_duration.labels(method).observe(self._clock() - started)

    @asynccontextmanager
    async def _answering(
        self, method: str, request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[None]:
        """A call's answer, observed: its request checked first; a ScalerError ends the call with its status."""
        async with _ended_with_status(method, context):
            with self._observe(method):
                _check_decoded(request)
                yield

    async def GetMetricSpec(
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        async with self._answering("GetMetricSpec", request, context):
            # No I/O here: KEDA calls it on every poll and HPA request, and its failure defeats fallback.
            # KEDA calls it first, when it reconciles the ScaledObject: collection starts then, so
            # data is there by the first GetMetrics.
            followed, spec = self._follow(request)
            return _spec_response(spec, followed.targets.target(spec))

    async def GetMetrics(
        self, request: pb.GetMetricsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        async with self._answering("GetMetrics", request, context):
            ref = request.scaledObjectRef
            spec = self._checked(ref)
            if request.metricName.lower() != spec.metric_name.lower():
                raise UnknownMetric(
                    f"metric {quoted(request.metricName)} is not served by this trigger; it serves"
                    f" {spec.metric_name!r}"
                )
            followed = self._registry.follow(ref.namespace, ref.name, spec)
            evaluation = self._evaluator.evaluate(followed, spec)
            if evaluation.value_unknown is not None:
                raise NoData(evaluation.value_unknown)  # SPEC §7: never a made-up 0 for what is not seen
            value = pb.MetricValue(
                metricName=spec.metric_name,
                metricValue=round_half_up(evaluation.value),
                metricValueFloat=evaluation.value,
            )
            return pb.GetMetricsResponse(metricValues=[value])

    async def IsActive(self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        async with self._answering("IsActive", request, context):
            followed, spec = self._follow(request)
            evaluation = self._evaluator.evaluate(followed, spec)
            if evaluation.activity_unknown is not None:
                raise NoData(evaluation.activity_unknown)  # SPEC §4: never `false` for what is not seen
            return pb.IsActiveResponse(result=evaluation.active)

    async def StreamIsActive(
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.IsActiveResponse]:
        async for _ in self._stream(self._activity_streams, request, context, self._activations):
            self._telemetry.stream_pushes.inc()
            yield pb.IsActiveResponse(result=True)

    async def StreamMetricSpec(
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.GetMetricSpecResponse]:
        async for response in self._stream(self._spec_streams, request, context, self._spec_updates):
            yield response

    async def _stream(
        self,
        slots: _StreamSlots,
        request: pb.ScaledObjectRef,
        context: grpc.aio.ServicerContext[Any, Any],
        messages: Callable[[pb.ScaledObjectRef, TriggerSpec, _Slot], AsyncIterator[Message]],
    ) -> AsyncIterator[Message]:
        """Every stream's life: opened as the unary call on the same ref would answer (its errors), within
        --max-streams, counted while open; it ends when the client goes (cancelled) or at shutdown."""
        async with self._answering(slots.method, request, context):
            spec = self._checked(request)
            ending = slots.room_for(request.namespace)  # refused: nothing followed, no stream ended
            self._registry.follow(request.namespace, request.name, spec)
            slot = slots.take(request.namespace, ending)
        with slots.held(slot):
            # What the data shows can never be answered (a model named in another case than the page's)
            # ends the stream with the status the unary call gives, never gRPC's UNKNOWN.
            async with _ended_with_status(slots.method, context):
                async for message in messages(request, spec, slot):
                    yield message

    async def _spec_updates(
        self, ref: pb.ScaledObjectRef, spec: TriggerSpec, slot: _Slot
    ) -> AsyncIterator[pb.GetMetricSpecResponse]:
        """The specs GetMetricSpec answers, at once, then each published change of the target: never an
        empty list, never the same specs twice in a row."""
        sent: pb.GetMetricSpecResponse | None = None
        with _CountedOpen(spec, lambda followed: followed.spec_streams) as counted:
            while not self._closing:
                slot.check()  # its place taken by another namespace's fair share: it ends
                # Forgotten, and no room to follow it again (the cap's share went to another namespace):
                # the stream ends with RESOURCE_EXHAUSTED, its --max-streams place freed for one followed.
                followed = self._registry.follow(ref.namespace, ref.name, spec)
                counted.at(followed)
                targets = followed.targets
                slot.wake = targets.wake
                response = _spec_response(spec, targets.target(spec))
                seen = targets.version
                if response != sent:
                    self._telemetry.spec_updates.labels("open" if sent is None else "change").inc()
                    sent = response
                    yield response
                    if self._closing:  # closed while the message was sent: no waiter was there to wake
                        break
                    slot.check()  # its place taken while the message was sent: no waiter to wake either
                    if self._registry.get(ref.namespace, ref.name) is not followed:
                        continue  # forgotten meanwhile: its targets' wakes (a move, shutdown) are over
                await targets.wait_for_change(seen, self._stream_recheck)

    async def _activations(
        self, ref: pb.ScaledObjectRef, spec: TriggerSpec, slot: _Slot
    ) -> AsyncIterator[None]:
        """Yield once per inactive→active transition (and at once if active when opened). Never false.

        Every `true` restarts KEDA's cooldown, so repeating it while active would delay scale-to-zero.
        While data is missing the last known state is kept: an outage is not a transition.
        """
        was_active = False
        slot.wake = functools.partial(self._store.wake, ref.namespace)
        with _CountedOpen(spec, lambda followed: followed.activity_streams) as counted:
            while not self._closing:
                slot.check()  # its place taken by another namespace's fair share: it ends
                seen = self._store.version(ref.namespace)
                # Following on every round keeps the ScaledObject's state fresh while its stream is open
                # (and counted open, it is not idle between rounds). Forgotten, with no room to follow it
                # again, the stream ends with RESOURCE_EXHAUSTED: a stream of a ScaledObject no longer
                # collected would hold a --max-streams place another namespace's wake needs.
                followed = self._registry.follow(ref.namespace, ref.name, spec)
                counted.at(followed)
                try:
                    evaluation = self._evaluator.evaluate(followed, spec)
                    active = was_active if evaluation.activity_unknown is not None else evaluation.active
                except NoData:
                    active = was_active
                if active and not was_active:
                    yield None
                    slot.check()  # its place taken while the message was sent: no waiter was there to wake
                was_active = active
                # Data also ages without any change, so re-check at least every recheck interval.
                await self._store.wait_for_change(ref.namespace, seen, self._stream_recheck)

    def _follow(self, ref: pb.ScaledObjectRef) -> tuple[Followed, TriggerSpec]:
        """The one path of every call: metadata → trigger, checked against this server, ScaledObject followed."""
        spec = self._checked(ref)
        return self._registry.follow(ref.namespace, ref.name, spec), spec

    def _checked(self, ref: pb.ScaledObjectRef) -> TriggerSpec:
        """The call's trigger, checked against this server. A call refused for any reason follows nothing:
        following takes a --max-scaledobjects place, and at the cap it makes another ScaledObject go."""
        spec = parse_trigger(ref.scalerMetadata)
        self._evaluator.check(spec)
        return spec


class _CountedOpen:
    """Where one stream of a trigger is counted open: on the Followed it last followed (a ScaledObject
    forgotten and followed again is a new one), until the stream ends. No count is kept at zero."""

    def __init__(self, spec: TriggerSpec, counts: Callable[[Followed], Counter[TriggerSpec]]) -> None:
        self._spec = spec
        self._counts = counts
        self._followed: Followed | None = None

    def at(self, followed: Followed) -> None:
        if followed is not self._followed:
            self._release()
            self._followed = followed
            self._counts(followed)[self._spec] += 1

    def _release(self) -> None:
        if self._followed is not None:
            counts = self._counts(self._followed)
            counts[self._spec] -= 1
            if counts[self._spec] <= 0:
                del counts[self._spec]
            self._followed = None

    def __enter__(self) -> _CountedOpen:
        return self

    def __exit__(self, *_: object) -> None:
        self._release()


def _spec_response(spec: TriggerSpec, target: float) -> pb.GetMetricSpecResponse:
    metric = pb.MetricSpec(metricName=spec.metric_name, targetSize=math.ceil(target), targetSizeFloat=target)
    return pb.GetMetricSpecResponse(metricSpecs=[metric])


class _StreamSlots:
    """The open streams of one RPC: at most --max-streams at once, shown on /metrics while open. At the
    limit each namespace has a fair share, as of --max-scaledobjects (SPEC §2): KEDA opens a stream per
    external-push trigger, and one namespace's triggers must not lock another's wake out."""

    def __init__(self, method: str, limit: int, gauge: Gauge) -> None:
        self.method = method
        self._limit = limit
        self._gauge = gauge
        self._by_namespace: dict[str, list[_Slot]] = {}

    @property
    def open(self) -> int:
        return sum(map(len, self._by_namespace.values()))

    def room_for(self, namespace: str) -> _Slot | None:
        """Within the limit: None. At it, for a namespace below its share (the limit divided among the
        namespaces with streams, its own counted): the newest stream of the namespace holding the most,
        to end; at or above its share, TooManyStreams."""
        if self.open < self._limit:
            return None
        namespaces = len(self._by_namespace) + (namespace not in self._by_namespace)
        share = self._limit // namespaces
        held = len(self._by_namespace.get(namespace, ()))
        if held < share:
            largest = max(self._by_namespace, key=lambda other: len(self._by_namespace[other]))
            return self._by_namespace[largest][-1]
        raise TooManyStreams(
            f"{self.open} {self.method} streams are open, the limit (--max-streams) is {self._limit};"
            f" namespace {namespace} holds {held}, at or above its fair share of {share}"
        )

    def take(self, namespace: str, ending: _Slot | None) -> _Slot:
        """A place for a stream of `namespace`, `ending` (room_for's answer) ended to make it."""
        if ending is not None:
            ending.end(f"namespace {namespace} took its fair share of --max-streams ({self._limit})")
            self._remove(ending)
        slot = _Slot(self.method, namespace)
        self._by_namespace.setdefault(namespace, []).append(slot)
        self._gauge.inc()
        return slot

    @contextmanager
    def held(self, slot: _Slot) -> Iterator[None]:
        try:
            yield
        finally:
            if slot.ended is None:
                self._remove(slot)

    def _remove(self, slot: _Slot) -> None:
        slots = self._by_namespace[slot.namespace]
        slots.remove(slot)
        if not slots:
            del self._by_namespace[slot.namespace]
        self._gauge.dec()


class _Slot:
    """One open stream's place; ended (with why) when another namespace took it: the stream then ends
    with RESOURCE_EXHAUSTED at its next round, and KEDA opens it again once there is room."""

    def __init__(self, method: str, namespace: str) -> None:
        self.method = method
        self.namespace = namespace
        self.ended: str | None = None
        self.wake: Callable[[], None] | None = None  # what the stream waits on, to end it at once

    def end(self, why: str) -> None:
        self.ended = why
        if self.wake is not None:
            self.wake()

    def check(self) -> None:
        if self.ended is not None:
            raise TooManyStreams(f"this {self.method} stream ended: {self.ended}")


class _Internal(ScalerError):
    """An unexpected failure: INTERNAL on the wire, as status_for answers for any unmapped error (its
    trace is in the log, not in the answer)."""

    def __init__(self, method: str) -> None:
        super().__init__(f"{method} failed unexpectedly; the scaler's log has the details")


@asynccontextmanager
async def _ended_with_status(method: str, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[None]:
    """A ScalerError ends the call with its status; anything else unexpected with INTERNAL (logged)."""
    try:
        yield
    except ScalerError as error:
        await _abort(context, error)
    except Exception:
        log.exception("%s failed unexpectedly", method)
        await _abort(context, _Internal(method))


async def _abort(context: grpc.aio.ServicerContext[Any, Any], error: ScalerError) -> NoReturn:
    await context.abort(status_for(error), str(error))
    raise AssertionError("unreachable: abort raises")


class Undecodable:
    """A request whose bytes are not the message the method takes (answered INVALID_ARGUMENT, not UNKNOWN)."""

    def __init__(self, error: str) -> None:
        self.error = error


def _lenient(message: Any) -> Callable[[bytes], Any]:
    # gRPC answers a request its deserializer rejects with UNKNOWN and no word of why: a caller's bad
    # bytes are a bad argument, so the method itself answers, naming the message it expected.
    def parse(data: bytes) -> Any:
        try:
            return message.FromString(data)
        except DecodeError as error:
            return Undecodable(f"the request is not a valid {message.DESCRIPTOR.full_name}: {error}")

    return parse


def _check_decoded(request: Any) -> None:
    if isinstance(request, Undecodable):
        raise ConfigError(request.error[:200])


def _external_scaler_handlers(scaler: ExternalScalerService) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
    """The generated service's method table, with deserializers that let the methods answer bad bytes."""
    ref, active = _lenient(pb.ScaledObjectRef), pb.IsActiveResponse.SerializeToString
    return {
        "IsActive": grpc.unary_unary_rpc_method_handler(scaler.IsActive, ref, active),
        "StreamIsActive": grpc.unary_stream_rpc_method_handler(scaler.StreamIsActive, ref, active),
        "GetMetricSpec": grpc.unary_unary_rpc_method_handler(
            scaler.GetMetricSpec, ref, pb.GetMetricSpecResponse.SerializeToString
        ),
        "GetMetrics": grpc.unary_unary_rpc_method_handler(
            scaler.GetMetrics, _lenient(pb.GetMetricsRequest), pb.GetMetricsResponse.SerializeToString
        ),
        "StreamMetricSpec": grpc.unary_stream_rpc_method_handler(
            scaler.StreamMetricSpec, ref, pb.GetMetricSpecResponse.SerializeToString
        ),
    }


def add_services(server: grpc.aio.Server, scaler: ExternalScalerService, health_status: HealthStatus) -> None:
    handlers = _external_scaler_handlers(scaler)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    # Registered too, as the generated code does: grpc then finds the methods without the generic lookup.
    server.add_registered_method_handlers(SERVICE_NAME, handlers)  # type: ignore[attr-defined]
    health_pb2_grpc.add_HealthServicer_to_server(health_status.servicer, server)
    reflection.enable_server_reflection(
        (SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
        server,
    )
