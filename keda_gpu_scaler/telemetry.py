"""The scaler's own metrics, logging, and HTTP endpoints (/metrics, /healthz, /readyz, /explain)."""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
import time
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from keda_gpu_scaler.scaling import Evaluation
from keda_gpu_scaler.trigger import TriggerSpec

PREFIX = "keda_gpu_scaler"
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
        self.ready = False
        self._explanations: dict[tuple[str, str], dict[str, Any]] = {}

    def scrape_done(self, *, ok: bool, seconds: float) -> None:
        self.scrapes.labels("ok" if ok else "error").inc()
        self.scrape_duration.observe(seconds)

    def record_evaluation(
        self,
        namespace: str,
        name: str,
        spec: TriggerSpec,
        evaluation: Evaluation | None,
        error: str | None,
        notes: tuple[str, ...] = (),
        discovery: dict[str, Any] | None = None,
    ) -> None:
        self.evaluations.labels("ok" if evaluation else "no_data").inc()
        entry: dict[str, Any] = {
            "namespace": namespace,
            "scaledObject": name,
            "evaluatedAt": time.time(),
            "trigger": _spec_json(spec),
        }
        if evaluation is not None:
            labels = (namespace, name, spec.metric_name)
            self.trigger_value.labels(*labels).set(evaluation.value)
            self.trigger_active.labels(*labels).set(1 if evaluation.active else 0)
            entry.update(evaluation_json(evaluation, spec))
        else:
            entry["error"] = error
        if notes:
            entry["notes"] = list(notes)
        if discovery is not None:
            entry["discovery"] = discovery
        self._explanations[(namespace, name)] = entry

    def explanation(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._explanations.get((namespace, name))

    def explained(self) -> list[tuple[str, str]]:
        return sorted(self._explanations)


def _spec_json(spec: TriggerSpec) -> dict[str, Any]:
    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}


def evaluation_json(evaluation: Evaluation, spec: TriggerSpec) -> dict[str, Any]:
    return {
        "value": evaluation.value,
        "active": evaluation.active,
        "activationThreshold": spec.activation_threshold,
        "threshold": spec.threshold,
        "aggregation": evaluation.aggregation.value,
        "pods": [
            {
                "pod": p.pod,
                "family": p.family.value,
                "value": p.value,
                "gpus": [{"gpu": g.gpu, "host": g.host, "value": g.value} for g in p.gpus],
            }
            for p in evaluation.pods
        ],
        "missingPods": list(evaluation.missing_pods),
        "missingPodValue": evaluation.missing_pod_value,
        "hpa": {
            "currentReplicas": evaluation.what_if.current_replicas,
            "desiredReplicasAverageValue": evaluation.what_if.average_value,
            "desiredReplicasValue": evaluation.what_if.value,
        },
    }


def http_app(telemetry: Telemetry) -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(telemetry.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        if telemetry.ready:
            return web.Response(text="ready\n")
        return web.Response(status=503, text="not ready\n")

    async def explain(request: web.Request) -> web.Response:
        namespace = request.query.get("namespace", "")
        name = request.query.get("name", "")
        if not namespace or not name:
            known = [{"namespace": ns, "name": n} for ns, n in telemetry.explained()]
            return web.json_response(
                {"error": "give ?namespace=NS&name=SCALEDOBJECT", "known": known}, status=400, dumps=_dumps
            )
        entry = telemetry.explanation(namespace, name)
        if entry is None:
            return web.json_response(
                {"error": f"no evaluation yet for ScaledObject {namespace}/{name}"}, status=404, dumps=_dumps
            )
        return web.json_response(entry, dumps=_dumps)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
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


def configure_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
