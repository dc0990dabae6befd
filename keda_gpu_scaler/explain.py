"""One-shot explain: scrape the exporters once (twice for a rate) and show what the scaler sees for a
ScaledObject's triggers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from keda_gpu_scaler.app import App
from keda_gpu_scaler.collect.gateway_source import GatewayCollectorSink
from keda_gpu_scaler.collect.http import client_session, exporter_fetcher
from keda_gpu_scaler.collect.inference import InferencePages
from keda_gpu_scaler.collect.scrape import ScrapeCollector, ScrapeLimits
from keda_gpu_scaler.collect.wanted import (
    EppPage,
    ExporterPage,
    PodPage,
    WantedSources,
    pod_page_bindings,
)
from keda_gpu_scaler.config.settings import Settings
from keda_gpu_scaler.core.errors import ConfigError, ScalerError
from keda_gpu_scaler.core.trigger import Metric, TriggerSpec
from keda_gpu_scaler.core.trigger_parse import parse_trigger
from keda_gpu_scaler.server.evaluator import Evaluator
from keda_gpu_scaler.server.http_endpoints import explanation_json
from keda_gpu_scaler.server.registry import Followed

# Seconds between the two reads of every page that a rate (`metric: demand`) is taken over.
RATE_INTERVAL = 2.0


async def explain_once(
    settings: Settings,
    namespace: str,
    name: str,
    triggers: Sequence[Mapping[str, str]],
    rate_interval: float = RATE_INTERVAL,
) -> list[dict[str, Any]]:
    """The entries /explain shows for each trigger (metadata), from one scrape of every page, or two
    `rate_interval` seconds apart when a trigger takes a rate; a trigger's errors become its entry's
    "error" field."""
    # The parts `serve` is made of, built by its composition root but not started: the same subscriptions,
    # so the pages read are exactly those the triggers read, and the same snapshots and evaluation.
    app = App(settings)
    evaluator, registry, wanted = app.evaluator, app.registry, app.wanted
    entries: list[dict[str, Any] | None] = []
    specs = []
    for metadata in triggers:
        try:
            spec = parse_trigger(metadata)
            evaluator.check(spec)
            if spec.metric is Metric.DEMAND and rate_interval > spec.window:
                # Its two reads are rate_interval apart: the rate would span more than the window says.
                raise ConfigError(
                    f"--rate-interval {rate_interval:g} is longer than metadata window={spec.window:g}: a"
                    f" rate over the window needs two reads within it; give --rate-interval <= {spec.window:g}"
                )
            followed = registry.follow(namespace, name, spec)
        except ScalerError as error:
            entries.append({"namespace": namespace, "scaledObject": name, "error": str(error)})
            continue
        entries.append(None)  # filled in after the scrape
        specs.append(spec)
    if not specs:
        return [entry for entry in entries if entry is not None]
    limits = ScrapeLimits(settings.scrape_interval, settings.scrape_timeout, settings.max_page_bytes, 8)
    # The very fetcher `serve` uses (its TLS and bearer token too), so explain sees what the scaler sees.
    session = client_session()
    try:
        fetcher = exporter_fetcher(session, settings)
    except BaseException:
        await session.close()
        raise
    collector = ScrapeCollector(
        fetcher=fetcher,
        store=app.store,
        interest=_ReadWhenAsked(),
        limits=limits,
        telemetry=app.telemetry,
        clock=app.clock,
    )
    wanted.handle(
        ExporterPage,
        lambda page: collector.add(page.url, interest_key=page),
        lambda page: collector.remove(page.url),
    )
    pages = InferencePages(collector)
    bindings = pod_page_bindings(pages.add_page, pages.remove, pod_ips=app.discovery is not None)
    wanted.handle(PodPage, bindings.added, bindings.removed)
    app.gateway_pages.start(GatewayCollectorSink(collector))
    rate = any(spec.metric is Metric.DEMAND for spec in specs)
    try:
        await _scrape_all(collector, wanted)
        if rate:
            # A rate needs every page at two instants: this evaluation starts each history the triggers
            # read with the page just read, the second read ends it.
            _evaluate_all(evaluator, followed, specs)
            await asyncio.sleep(rate_interval)
            await _scrape_all(collector, wanted)
    finally:
        await collector.stop()
        await session.close()
    problems = [f"{s.source}: {s.last_error}" for s in app.store.sources() if s.last_error]
    evaluated = iter(specs)
    for index, entry in enumerate(entries):
        if entry is not None:
            continue
        spec = next(evaluated)
        _evaluate_all(evaluator, followed, [spec])
        explanation = followed.triggers[spec].explanation
        assert explanation is not None
        entries[index] = entry = explanation_json(namespace, name, explanation)
        if problems:
            entry["exporterErrors"] = problems
        if rate:
            entry["readTwiceSecondsApart"] = rate_interval
    return [entry for entry in entries if entry is not None]


class _ReadWhenAsked:
    """The collector's interest for a one-shot explain: its scrape loops never read (want nothing), so
    every page is read exactly when _scrape_all asks, once or twice rate_interval apart; a loop's own
    read in between would add a third point to a rate."""

    def wanted(self, key: Hashable) -> bool:
        return False

    async def wait_until_wanted(self, timeout: float, key: Hashable) -> None:
        await asyncio.sleep(timeout)


async def _scrape_all(collector: ScrapeCollector, wanted: WantedSources) -> None:
    """Every page the triggers read, once."""
    urls = sorted(
        {
            *(page.url for page in wanted.of_kind(ExporterPage)),
            *(page.url for page in wanted.of_kind(PodPage)),
            *(page.url for page in wanted.of_kind(EppPage)),
        }
    )
    await asyncio.gather(*(collector.scrape_once(url) for url in urls))


def _evaluate_all(evaluator: Evaluator, followed: Followed, specs: Sequence[TriggerSpec]) -> None:
    """Evaluate each trigger; its errors are recorded in its explanation with their message."""
    for spec in specs:
        with contextlib.suppress(ScalerError):
            evaluator.evaluate(followed, spec)


def render_table(entry: Mapping[str, Any]) -> str:
    """A human table of an explanation entry (as /explain returns it)."""
    lines = [f"ScaledObject {entry.get('namespace')}/{entry.get('scaledObject')}"]
    trigger = entry.get("trigger")
    if trigger:
        where = (
            f"inferencePool={trigger['inferencePool']}"
            if trigger["metric"] == "pending"
            else f"podNamePrefix={trigger['podNamePrefix']}"
        )
        lines[0] += f"  metric={trigger['metric']} threshold={trigger['threshold']:g} {where}"
    if "readTwiceSecondsApart" in entry:
        lines.append(f"  read twice, {entry['readTwiceSecondsApart']:g} s apart, for a rate")
    for problem in entry.get("exporterErrors", []):
        lines.append(f"  exporter error: {problem}")
    if "error" in entry:
        lines.append(f"  error: {entry['error']}")
        return "\n".join(lines)
    if "gatewayReplicas" in entry:
        lines.extend(_pending_lines(entry))
        return "\n".join(lines)
    metric = trigger["metric"] if trigger else "utilization"
    if metric in _INFERENCE_VALUE_COLUMNS:
        lines.extend(_inference_lines(entry, _INFERENCE_VALUE_COLUMNS[metric], _INPUTS_OF.get(metric)))
    else:
        lines.extend(_gpu_lines(entry))
    hpa = entry["hpa"]
    if hpa is None:  # GetMetrics answers UNAVAILABLE: no value, so no replica count either
        lines.append(f"  value unknown: {entry.get('valueUnknown')}   {_activity(entry)}")
        return "\n".join(lines)
    lines.append(
        f"  value = {entry['value']:.2f} ({entry['aggregation']} over {counted(hpa['currentReplicas'], 'pod')})"
        f"   {_activity(entry)}"
    )
    lines.append(
        f"  HPA would ask for {counted(hpa['desiredReplicasAverageValue'], 'replica')} with metricType"
        f" AverageValue, {hpa['desiredReplicasValue']} with Value (never fewer than minReplicaCount, and at"
        " least 1)"
    )
    return "\n".join(lines)


def _activity(entry: Mapping[str, Any]) -> str:
    """`active = true|false (> activationThreshold)`, or that activity cannot be told and why (IsActive
    answers UNAVAILABLE there, SPEC §4): never `false` for what is not seen."""
    unknown = entry.get("activityUnknown")
    if unknown:
        return f"active = unknown (IsActive answers UNAVAILABLE: {unknown})"
    return f"active = {str(entry['active']).lower()} (> {entry['activationThreshold']:g})"


def counted(count: int, noun: str) -> str:
    """ "1 pod", "2 pods", "0 pods"."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _gpu_lines(entry: Mapping[str, Any]) -> list[str]:
    """GPU metrics: each pod's GPUs, each GPU's value and the pod's."""
    lines = [f"  {'POD':<36} {'FAMILY':<7} {'GPU':<44} {'HOST':<16} {'GPU%':>7} {'POD%':>7}"]
    for pod in entry["pods"]:
        for index, gpu in enumerate(pod["gpus"]):
            pod_cell = f"{pod['pod']:<36} {pod['family']:<7}" if index == 0 else " " * 44
            pod_value = f"{pod['value']:7.1f}" if index == 0 else ""
            lines.append(f"  {pod_cell} {gpu['gpu']:<44} {gpu['host']:<16} {gpu['value']:7.1f} {pod_value}")
    for pod in entry["missingPods"]:
        lines.append(
            f"  {pod:<36} {'-':<7} {'(no fresh data)':<44} {'':<16} {'':>7} {entry['missingPodValue']:7.1f}"
        )
    return lines


# Inference metrics: what the per-pod value column is called (its inputs have columns of their own).
_INFERENCE_VALUE_COLUMNS = {
    "requests": "IN FLIGHT",
    "queue": "QUEUED",
    "kv_cache": "POD KV%",
    "demand": "RATE/S",
}
# The inputs an inference pod's entry carries (PodValue.inputs), as column headings.
_INFERENCE_INPUTS = (("running", "RUNNING"), ("waiting", "WAITING"), ("kvCache", "KV-CACHE%"))
# `demand`: the pages its rate was taken over, the seconds between the first and the last, and 1 where
# the pod had no rate yet and counts as the mean of the others.
_INPUTS_OF = {"demand": (("samplesUsed", "SAMPLES"), ("spanSeconds", "SPAN S"), ("meanOfOthers", "MEAN"))}


def _inference_lines(
    entry: Mapping[str, Any], value_column: str, columns: tuple[tuple[str, str], ...] | None = None
) -> list[str]:
    """Inference metrics: each pod's engine, running and waiting requests, KV-cache, and its value."""
    columns = columns or _INFERENCE_INPUTS
    heading = " ".join(f"{title:>9}" for _, title in columns)
    lines = [f"  {'POD':<36} {'ENGINE':<8} {heading} {value_column:>9}"]
    for pod in entry["pods"]:
        inputs = pod.get("inputs", {})
        cells = " ".join(
            f"{'-' if inputs.get(key) is None else format(inputs[key], 'g'):>9}" for key, _ in columns
        )
        lines.append(f"  {pod['pod']:<36} {pod['family']:<8} {cells} {pod['value']:9.1f}")
    for pod in entry["missingPods"]:
        lines.append(f"  {pod:<36} {'-':<8} {'(no fresh data)':<29} {entry['missingPodValue']:9.1f}")
    return lines


def _pending_lines(entry: Mapping[str, Any]) -> list[str]:
    """metric=pending: each endpoint-picker replica, whether it was read fresh, and its queue by model."""
    lines = [f"  {'EPP REPLICA':<48} {'FRESH':<6} {'PENDING':>8}  QUEUE BY MODEL"]
    for replica in entry["gatewayReplicas"]:
        if not replica["fresh"]:
            lines.append(f"  {replica['replica']:<48} {'no':<6} {'-':>8}")
            continue
        models = (
            ", ".join(f"{model}={count:g}" for model, count in replica["queueByModel"].items()) or "(empty)"
        )
        if replica.get("turnedAwaySincePreviousPage"):
            models += f"; turned away since its previous page: {replica['turnedAwaySincePreviousPage']:g}"
        lines.append(f"  {replica['replica']:<48} {'yes':<6} {replica['pending']:8g}  {models}")
    for note in entry.get("notes", []):
        lines.append(f"  note: {note}")
    hpa = entry["hpa"]
    if entry.get("valueUnknown"):
        lines.append(
            f"  value = unknown (GetMetrics answers UNAVAILABLE: {entry['valueUnknown']})   {_activity(entry)}"
        )
        return lines
    lines.append(
        f"  value = {entry['value']:g} requests held for InferencePool {entry['inferencePool']}"
        f"   {_activity(entry)}"
    )
    lines.append(
        f"  HPA would ask for {counted(hpa['desiredReplicasAverageValue'], 'replica')} with metricType"
        " AverageValue"
    )
    return lines
