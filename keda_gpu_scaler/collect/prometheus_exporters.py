"""Which GPU exporters behind Prometheus are still there, and still name pods: each counts as one source,
as when its page is scraped directly (SPEC §4), so one exporter's outage cannot shrink a value."""

from __future__ import annotations

from collections.abc import Collection

from keda_gpu_scaler.collect.prometheus_client import PrometheusClient
from keda_gpu_scaler.pages.prometheus_answer import samples_with_times, target_of, unattributed, up_series
from keda_gpu_scaler.pages.promql import Target, attribution_query, liveness_query, up_query


async def live_targets(
    client: PrometheusClient, targets: Collection[Target], at: float, window: float
) -> set[Target]:
    """Which of these targets Prometheus still scrapes: any GPU series of theirs is at most `window` old."""
    # Series without job/instance cannot be asked about; Prometheus' staleness is trusted for them.
    alive = {t for t in targets if t == ("", "")}
    asked = [t for t in targets if t != ("", "")]
    if asked:
        for element in await client.query(liveness_query(asked), at, "liveness"):
            target = target_of(element.labels)
            if target in asked and at - element.value <= window:
                alive.add(target)
    return alive


async def unattributed_targets(
    client: PrometheusClient, namespace: str, targets: Collection[Target], at: float
) -> set[Target]:
    """Of these live targets, those whose GPU series name no pod but their own: an attribution outage
    (dcgm-exporter prints its GPUs without pod labels when the kubelet's pod-resources socket fails)."""
    named = [target for target in targets if target != ("", "")]
    if not named:
        return set()
    groups = await client.query(attribution_query(named), at, "attribution")
    ups = up_series(samples_with_times(await client.query(up_query(namespace, (), named), at, "up")))
    return unattributed(named, groups, ups)
