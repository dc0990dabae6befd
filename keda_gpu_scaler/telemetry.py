"""The scaler's own metrics, logging, and HTTP endpoints (/metrics, /healthz, /readyz, /explain)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import json
import logging
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from keda_gpu_scaler.registry import Explanation
from keda_gpu_scaler.scaling import Evaluation, PodValue
from keda_gpu_scaler.trigger import KEYS, TriggerSpec

PREFIX = "keda_gpu_scaler"
# How long an HTTP connection may stay without a complete request (header read timeout and idle limit).
# Prometheus reconnects for each scrape after this; 10 s is far above any honest client's header time.
HTTP_IDLE_SECONDS = 10.0
# The same error logged again within this many seconds is counted, not printed (see _OncePerInterval).
REPEATED_ERROR_SECONDS = 10.0
_RPC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class Telemetry:
    """Owns the metrics registry and the last evaluation of every ScaledObject (for /explain)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.rpc_requests = Counter(
            f"{PREFIX}_rpc_requests",
            "gRPC calls answered, by method and status code",
            ["method", "code"],
            registry=r,
        )
        self.rpc_duration = Histogram(
            f"{PREFIX}_rpc_duration_seconds",
            "gRPC call latency",
            ["method"],
            buckets=_RPC_BUCKETS,
            registry=r,
        )
        self.open_streams = Gauge(f"{PREFIX}_open_streams", "StreamIsActive streams open now", registry=r)
        self.stream_pushes = Counter(
            f"{PREFIX}_stream_pushes", "true values pushed on StreamIsActive (inactive→active)", registry=r
        )
        self.evaluations = Counter(
            f"{PREFIX}_evaluations", "workload evaluations, by result", ["result"], registry=r
        )
        self.trigger_value = Gauge(
            f"{PREFIX}_trigger_value",
            "last value computed for a ScaledObject's trigger",
            ["namespace", "scaledobject", "metric"],
            registry=r,
        )
        self.trigger_active = Gauge(
            f"{PREFIX}_trigger_active",
            "1 when the last evaluation found the workload active",
            ["namespace", "scaledobject", "metric"],
            registry=r,
        )
        self.aggregation_mismatches = Counter(
            f"{PREFIX}_aggregation_mismatches",
            "evaluations whose explicit aggregation contradicts the trigger's metricType",
            registry=r,
        )
        self.scrapes = Counter(f"{PREFIX}_scrapes", "exporter scrapes, by result", ["result"], registry=r)
        self.scrape_duration = Histogram(
            f"{PREFIX}_scrape_duration_seconds", "exporter scrape latency including parsing", registry=r
        )
        # What the Prometheus source costs the Prometheus it reads: queries by purpose (namespace, gpus,
        # liveness, fleet) and result.
        self.prometheus_queries = Counter(
            f"{PREFIX}_prometheus_queries",
            "instant queries sent by the Prometheus source, by purpose and result",
            ["query", "result"],
            registry=r,
        )
        self.prometheus_query_duration = Histogram(
            f"{PREFIX}_prometheus_query_duration_seconds",
            "Prometheus source query latency including parsing",
            registry=r,
        )
        self.followed_scaled_objects = Gauge(
            f"{PREFIX}_scaledobjects_followed",
            "ScaledObjects the scaler keeps state for (called within --interest-ttl)",
            registry=r,
        )
        self.ready = False

    def scrape_done(self, *, ok: bool, seconds: float) -> None:
        self.scrapes.labels("ok" if ok else "error").inc()
        self.scrape_duration.observe(seconds)

    def forget_labels(self, label_sets: Iterable[tuple[str, str, str]]) -> None:
        """Remove a forgotten ScaledObject's series, so /metrics does not grow with every name ever seen."""
        for labels in label_sets:
            for gauge in (self.trigger_value, self.trigger_active):
                with contextlib.suppress(KeyError):
                    gauge.remove(*labels)


def _spec_json(spec: TriggerSpec) -> dict[str, Any]:
    """The trigger as its metadata keys name it (camelCase, like the ScaledObject)."""
    keys = {k.field: k.key for k in KEYS}
    return {keys.get(f.name, f.name): getattr(spec, f.name) for f in dataclasses.fields(spec)}


def explanation_json(namespace: str, name: str, explanation: Explanation) -> dict[str, Any]:
    """What /explain and the explain command show for one ScaledObject's last evaluation."""
    spec = explanation.spec
    entry: dict[str, Any] = {
        "namespace": namespace,
        "scaledObject": name,
        "evaluatedAt": datetime.datetime.fromtimestamp(explanation.evaluated_at, datetime.UTC).isoformat(
            timespec="milliseconds"
        ),
        "trigger": _spec_json(spec),
    }
    if explanation.evaluation is not None:
        entry.update(evaluation_json(explanation.evaluation, spec))
    else:
        entry["error"] = explanation.error
    if explanation.notes:
        entry["notes"] = list(explanation.notes)
    if explanation.discovery is not None:
        entry["discovery"] = explanation.discovery
    return entry


def _pod_json(pod: PodValue) -> dict[str, Any]:
    entry: dict[str, Any] = {"pod": pod.pod, "family": str(pod.family), "value": pod.value}
    if pod.inputs:
        entry["inputs"] = dict(pod.inputs)  # an inference server's waiting, running and KV-cache %
    else:
        entry["gpus"] = [{"gpu": g.gpu, "host": g.host, "value": g.value} for g in pod.gpus]
    return entry


def evaluation_json(evaluation: Evaluation, spec: TriggerSpec) -> dict[str, Any]:
    if spec.metric.gateway:
        return _pending_json(evaluation, spec)
    return {
        "value": evaluation.value,
        "active": evaluation.active,
        "activationThreshold": spec.activation_threshold,
        "threshold": spec.threshold,
        "aggregation": evaluation.aggregation.value,
        "pods": [_pod_json(p) for p in evaluation.pods],
        "missingPods": list(evaluation.missing_pods),
        "missingPodValue": evaluation.missing_pod_value,
        "hpa": {
            "currentReplicas": evaluation.what_if.current_replicas,
            "desiredReplicasAverageValue": evaluation.what_if.average_value,
            "desiredReplicasValue": evaluation.what_if.value,
        },
    }


def _pending_json(evaluation: Evaluation, spec: TriggerSpec) -> dict[str, Any]:
    """metric=pending: per endpoint-picker replica, whether its page was fresh and its queue by model."""
    replicas: list[dict[str, Any]] = [
        {"replica": p.pod, "fresh": True, "pending": p.value, "queueByModel": dict(p.inputs)}
        for p in evaluation.pods
    ]
    replicas += [{"replica": name, "fresh": False} for name in evaluation.missing_pods]
    return {
        "value": evaluation.value,
        "active": evaluation.active,
        "activationThreshold": spec.activation_threshold,
        "threshold": spec.threshold,
        "inferencePool": spec.inference_pool,
        "gatewayReplicas": replicas,
        "hpa": {
            "currentReplicas": evaluation.what_if.current_replicas,
            "desiredReplicasAverageValue": evaluation.what_if.average_value,
            "desiredReplicasValue": evaluation.what_if.value,
        },
    }


# Explanations of a big namespace run to megabytes of JSON: built on a worker thread, not the event loop.
_JSON_OFF_LOOP_PODS = 200


class ExplanationSource(Protocol):
    def explanation(self, namespace: str, name: str) -> Explanation | None: ...

    def explained(self) -> list[tuple[str, str]]: ...


def http_app(telemetry: Telemetry, explanations: ExplanationSource | None = None) -> web.Application:
    """/metrics, /healthz, /readyz, and /explain when `explanations` is given (--explain on)."""

    async def metrics(_: web.Request) -> web.Response:
        # Thousands of label sets take long to render: off the loop, so gRPC calls are not held up.
        body = await asyncio.to_thread(generate_latest, telemetry.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        if telemetry.ready:
            return web.Response(text="ready\n")
        return web.Response(status=503, text="not ready\n")

    async def explain(request: web.Request) -> web.Response:
        assert explanations is not None
        namespace = request.query.get("namespace", "")
        name = request.query.get("name", "")
        if not namespace or not name:
            known = [{"namespace": ns, "name": n} for ns, n in explanations.explained()]
            return web.json_response(
                {"error": "give ?namespace=NS&name=SCALEDOBJECT", "known": known}, status=400, dumps=_dumps
            )
        explanation = explanations.explanation(namespace, name)
        if explanation is None:
            return web.json_response(
                {"error": f"no evaluation yet for ScaledObject {namespace[:100]}/{name[:100]}"},
                status=404,
                dumps=_dumps,
            )
        evaluation = explanation.evaluation
        pods = 0 if evaluation is None else len(evaluation.pod_rows) + len(evaluation.missing_pods)

        def render() -> str:
            return _dumps(explanation_json(namespace, name, explanation))

        text = await asyncio.to_thread(render) if pods > _JSON_OFF_LOOP_PODS else render()
        return web.Response(text=text, content_type="application/json")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if explanations is not None:
        app.router.add_get("/explain", explain)
    return app


def _dumps(value: Any) -> str:
    return json.dumps(value, indent=2, default=str)


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class OncePerInterval(logging.Filter):
    """Lets one record of each message through per interval; says how many were held back.

    When file descriptors run out, asyncio logs every failed accept() with a traceback, thousands a
    second: the log would bury everything else and cost CPU that the gRPC answers need.
    """

    def __init__(self, interval: float = REPEATED_ERROR_SECONDS, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self._interval = interval
        self._clock = clock
        self._last: dict[str, tuple[float, int]] = {}  # message → (last printed, held back since)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = str(record.msg)[:200]
        now = self._clock()
        printed, held = self._last.get(key, (float("-inf"), 0))
        if now - printed < self._interval:
            self._last[key] = (printed, held + 1)
            return False
        if len(self._last) > 1000:
            self._last.clear()
        self._last[key] = (now, 0)
        if held:
            record.msg = f"{record.msg} (and {held} more like it in the last {now - printed:.0f}s)"
        return True


def configure_logging(level: str, fmt: str) -> None:
    # asyncio's own errors (accept() failing when descriptors run out) repeat at machine speed.
    asyncio_log = logging.getLogger("asyncio")
    if not any(isinstance(f, OncePerInterval) for f in asyncio_log.filters):
        asyncio_log.addFilter(OncePerInterval())
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
