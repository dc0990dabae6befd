"""grpc.health.v1 for the scaler: SERVING while running, NOT_SERVING once shutting down.

Not grpc_health's servicer: its Watch never returns, so one client watching held every shutdown for the
whole --shutdown-grace and then ended UNAVAILABLE. Here a Watch sends NOT_SERVING and ends with OK once
shutdown begins, as the scaler's own streams do.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

# The services a probe may name: the server as a whole, Kubernetes' liveness and readiness; the scaler's
# own service name is added by its caller.
HEALTH_SERVICES = ("", "liveness", "readiness")
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class HealthServicer(health_pb2_grpc.HealthServicer):  # type: ignore[misc]  # untyped generated base
    def __init__(self) -> None:
        self._status: dict[str, Any] = {"": SERVING}
        self._changed = asyncio.Event()
        self._ended = False

    async def Check(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        status = self._status.get(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no service {request.service!r} here")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        sent = None
        while True:
            changed = self._changed  # taken before the status: a change after it wakes this round
            status = self._status.get(request.service, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
            if status != sent:
                await context.write(health_pb2.HealthCheckResponse(status=status))
                sent = status
            if self._ended:
                return  # shutting down, and NOT_SERVING was sent: the stream ends with OK
            await changed.wait()

    def set(self, services: tuple[str, ...], status: Any, *, ending: bool = False) -> None:
        self._status.update(dict.fromkeys(services, status))
        self._ended = self._ended or ending
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()


class HealthStatus:
    """The grpc.health.v1 services of the scaler: SERVING while running, NOT_SERVING once shutting down."""

    def __init__(self, service_name: str) -> None:
        self.servicer = HealthServicer()
        self._services = (*HEALTH_SERVICES, service_name)

    async def set_serving(self, serving: bool) -> None:
        # Not serving is only ever said at shutdown: every Watch then ends.
        self.servicer.set(self._services, SERVING if serving else NOT_SERVING, ending=not serving)
