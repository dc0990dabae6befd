"""The scaler's own metrics (prefix keda_gpu_scaler_): one registry, made by the app and passed down."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

PREFIX = "keda_gpu_scaler"
# The per-trigger series (value, activity, learned target) share one label set.
TRIGGER_LABELS = ("namespace", "scaledobject", "metric")
# Triggers of one ScaledObject whose value and activity /metrics shows: a real ScaledObject has one or
# two; 16 metric names on each of 300 ScaledObjects once made /metrics 822 KB. /metrics so holds at most
# 3 × MAX_PUBLISHED_TRIGGERS × --max-scaledobjects labelled series (value, activity and, with `threshold:
# auto`, the learned target; about 0.7 KB per ScaledObject of two triggers); the triggers beyond it are
# evaluated and explained as any other, and counted in unpublished_triggers.
MAX_PUBLISHED_TRIGGERS = 4
_RPC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class Telemetry:
    """Owns the metrics registry and the scaler's own series."""

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
        self.open_spec_streams = Gauge(
            f"{PREFIX}_open_spec_streams", "StreamMetricSpec streams open now", registry=r
        )
        self.spec_updates = Counter(
            f"{PREFIX}_spec_updates",
            "specs sent on StreamMetricSpec: on opening, and on a change of target",
            ["reason"],
            registry=r,
        )
        self.stream_pushes = Counter(
            f"{PREFIX}_stream_pushes", "true values pushed on StreamIsActive (inactive→active)", registry=r
        )
        self.evaluations = Counter(
            f"{PREFIX}_evaluations", "workload evaluations, by result", ["result"], registry=r
        )
        self.trigger_value = Gauge(
            f"{PREFIX}_trigger_value",
            "last value computed for a ScaledObject's trigger",
            TRIGGER_LABELS,
            registry=r,
        )
        self.trigger_active = Gauge(
            f"{PREFIX}_trigger_active",
            "1 when the last evaluation found the workload active",
            TRIGGER_LABELS,
            registry=r,
        )
        self.learned_target = Gauge(
            f"{PREFIX}_learned_target",
            "the target a threshold: auto trigger has learned (its thresholdStart until it moves)",
            TRIGGER_LABELS,
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
        self.unpublished_triggers = Counter(
            f"{PREFIX}_triggers_unpublished",
            f"trigger values not shown on /metrics: their ScaledObject already shows {MAX_PUBLISHED_TRIGGERS}",
            registry=r,
        )
        self.ready = False
        # (namespace, ScaledObject) → the metric names whose series are shown
        self._published: dict[tuple[str, str], set[str]] = {}

    def scrape_done(self, *, ok: bool, seconds: float) -> None:
        self.scrapes.labels("ok" if ok else "error").inc()
        self.scrape_duration.observe(seconds)

    def publish_trigger(
        self, labels: tuple[str, str, str], value: float, active: bool | None, learned: float | None = None
    ) -> bool:
        """Show a trigger's last value and activity (and its learned target, if any) under (namespace,
        scaledobject, metric); False (and nothing shown) when its ScaledObject already shows
        MAX_PUBLISHED_TRIGGERS other metrics."""
        shown = self._published.setdefault(labels[:2], set())
        if labels[2] not in shown:
            if len(shown) >= MAX_PUBLISHED_TRIGGERS:
                self.unpublished_triggers.inc()
                return False
            shown.add(labels[2])
        self.trigger_value.labels(*labels).set(value)
        # Activity that cannot be told (IsActive UNAVAILABLE) is NaN, never the 0 of "inactive".
        self.trigger_active.labels(*labels).set(math.nan if active is None else 1 if active else 0)
        if learned is not None:
            self.learned_target.labels(*labels).set(learned)
        return True

    def forget_labels(self, label_sets: Iterable[tuple[str, str, str]]) -> None:
        """Remove a forgotten ScaledObject's series, so /metrics does not grow with every name ever seen."""
        for labels in label_sets:
            shown = self._published.get(labels[:2])
            if shown is not None:
                shown.discard(labels[2])
                if not shown:
                    del self._published[labels[:2]]
            for gauge in (self.trigger_value, self.trigger_active, self.learned_target):
                with contextlib.suppress(KeyError):
                    gauge.remove(*labels)
