"""Prometheus source: the wanted namespaces' GPU series, with their sample times, from a PromQL query API,
and their inference servers' series (SPEC §6) the same way.

The parts: PromQL text (promql.py), the HTTP client with its credentials and TLS (prometheus_client.py),
answer decoding (prometheus_answer.py), and here the collector that turns answers into the store's pages.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from keda_gpu_scaler.collect.backoff import MAX_BACKOFF_INTERVALS, backoff_delay, jittered
from keda_gpu_scaler.collect.gateway_source import ReplicaQueue
from keda_gpu_scaler.collect.page_workers import PAGE_OWNER, worked_for_answer
from keda_gpu_scaler.collect.prometheus_client import PrometheusClient
from keda_gpu_scaler.collect.prometheus_exporters import live_targets, unattributed_targets
from keda_gpu_scaler.collect.prometheus_sources import (
    EPP_SERIES,
    GATEWAY_SERIES,
    GPU_SERIES,
    INFERENCE_SERIES,
    gateway_source,
    inference_source,
    namespace_source,
    pod_inference_source,
    query_name,
    sample_window,
)
from keda_gpu_scaler.collect.store import Page, Store
from keda_gpu_scaler.collect.supervise import cancel_all
from keda_gpu_scaler.collect.wanted import PrometheusQuery, WantedSources
from keda_gpu_scaler.core.selectors import DEFAULT_EXPORTER_NAMESPACES
from keda_gpu_scaler.core.snapshot import Reading, SourceKind
from keda_gpu_scaler.pages.engines import PodSamples
from keda_gpu_scaler.pages.exposition import Sample
from keda_gpu_scaler.pages.gateways import NotAGatewayPage, QueueTable, since
from keda_gpu_scaler.pages.prometheus_answer import (
    ATTRIBUTION_LOST,
    FreshSeries,
    PrometheusError,
    ReplicaLost,
    Up,
    down_pods,
    gateway_replicas,
    inference_pods,
    lost_pod,
    lost_target,
    merged,
    replica_tables,
    samples_with_times,
    target_pages,
    up_series,
)
from keda_gpu_scaler.pages.promql import (
    Target,
    down_exporters_query,
    fleet_query,
    gateway_query,
    gpu_queries,
    inference_query,
    namespace_query,
    up_query,
)
from keda_gpu_scaler.pages.vendors import GpuReading

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _TargetSource:
    source: str
    collected_at: float  # monotonic time of its last page


class PrometheusCollector:
    """Per wanted namespace, one loop: query, normalise, store one page per exporter behind Prometheus.

    Per namespace wanted for inference metrics, another loop: one query for the engines' families, stored
    as one page of PodSamples (see collect_inference_once).

    Pages are kept per scrape target (job, instance), not per namespace, so that the store treats each
    exporter behind Prometheus as it treats one scraped directly: a target whose series go stale makes its
    pods count as missing (one dead exporter cannot shrink the value), as do those of a target still
    scraped that names no pod at all (an attribution outage), while one that names other pods now means
    the pod is gone (prometheus_exporters). A per-namespace source records whether Prometheus answers.
    """

    def __init__(
        self,
        *,
        client: PrometheusClient,
        store: Store,
        wanted: WantedSources,
        interval: float,
        max_staleness: float,
        clock: Callable[[], float],
        wall_clock: Callable[[], float] = time.time,
        exporter_namespaces: frozenset[str] | None = frozenset(DEFAULT_EXPORTER_NAMESPACES),
    ) -> None:
        self._client = client
        # --exporter-namespaces: the scrape targets whose series may name another namespace's pods.
        self._exporter_namespaces = exporter_namespaces
        self._store = store
        self._wanted = wanted
        self._interval = interval
        self._window = sample_window(max_staleness, interval)
        self._clock = clock
        self._wall = wall_clock
        self._targets: dict[str, dict[Target, _TargetSource]] = {}
        # The queries whose last answer failed, each said once in the log until it answers again.
        self._failing: set[PrometheusQuery] = set()
        # Per namespace, the pods its inference page has named, by the scrape targets that served them:
        # the only pods that get a source of their own when their series stop (see collect_inference_once).
        self._inference_pods: dict[str, dict[str, frozenset[Target]]] = {}
        self._inference_missing: dict[str, set[str]] = {}  # those of them with such a source now
        # Per (namespace, pool), the EPP replicas seen with fresh series, by the targets that served them.
        self._gateway_replicas: dict[tuple[str, str], dict[str, frozenset[Target]]] = {}
        # (namespace, pool) → replica → its previous answer's queue: requests turned away for want of an
        # endpoint are the growth of a counter from one answer to the next (SPEC §7).
        self._gateway_previous: dict[tuple[str, str], dict[str, QueueTable]] = {}
        self._told_no_sample_times = False
        self._fleet_seen_until = float("-inf")
        self._tasks: dict[PrometheusQuery, asyncio.Task[None]] = {}

    def start(self) -> None:
        """Collect every query wanted (now and from now on) while it is wanted."""
        self._wanted.handle(PrometheusQuery, self._query_wanted, self._query_unwanted)

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, {}
        await cancel_all(tasks.values())

    def _query_wanted(self, query: PrometheusQuery) -> None:
        namespace, pool = query.namespace, query.pool
        if query.what == GATEWAY_SERIES and pool is not None:
            run = self._loop(
                namespace,
                lambda _: self.collect_gateway_once(namespace, pool),
                f"gateway collection of {pool}",
            )
        elif query.what == INFERENCE_SERIES:
            run = self._loop(namespace, self.collect_inference_once, "inference collection")
        else:
            run = self._loop(namespace, self.collect_once, "collection")
        self._tasks[query] = asyncio.create_task(run, name=f"prometheus {query}")

    def _query_unwanted(self, query: PrometheusQuery) -> None:
        """No trigger asks for it any more: its loop ends and its sources go (a new call starts again)."""
        task = self._tasks.pop(query, None)
        if task is not None:
            task.cancel()
        self._failing.discard(query)
        if query.what == GATEWAY_SERIES and query.pool is not None:
            self._forget_gateway(query.namespace, query.pool)
        elif query.what == INFERENCE_SERIES:
            self._forget_inference(query.namespace)
        else:
            self._forget(query.namespace)

    async def _loop(self, namespace: str, collect: Callable[[str], Awaitable[bool]], what: str) -> None:
        """Collect now and every interval (backing off while it fails) until cancelled."""
        failures, said = 0, None
        PAGE_OWNER.set(namespace)  # this task's: its answers are worked through in the namespace's turn
        while True:
            try:
                # In the namespace's turn (fair between namespaces): the round takes its evaluation time
                # once it has one, so time spent waiting for it never counts as the data's age.
                async with self._client.slot(namespace):
                    ok = await collect(namespace)
            except Exception as error:
                # A bug must not end the namespace's collection for good: its data goes stale and the
                # calls say UNAVAILABLE, the log says why (once, until a round succeeds), and the next
                # round tries again.
                why = f"{type(error).__name__}: {error}"
                if why != said:
                    log.exception("Prometheus source, namespace %s: %s failed", namespace, what)
                said, ok = why, False
            else:
                said = None if ok else said
            failures = 0 if ok else failures + 1
            delay = backoff_delay(failures, first=self._interval, cap=self._interval * MAX_BACKOFF_INTERVALS)
            # Jitter only shortens the wait: data must never be older than one interval because of it.
            await asyncio.sleep(jittered(delay))

    def _forget(self, namespace: str) -> None:
        for target in self._targets.pop(namespace, {}).values():
            self._store.remove_source(target.source)
        self._store.remove_source(namespace_source(namespace))

    def _forget_inference(self, namespace: str) -> None:
        self._inference_pods.pop(namespace, None)
        for pod in self._inference_missing.pop(namespace, set()):
            self._store.remove_source(pod_inference_source(namespace, pod))
        self._store.remove_source(inference_source(namespace))

    def _forget_gateway(self, namespace: str, pool: str) -> None:
        self._gateway_replicas.pop((namespace, pool), None)
        self._gateway_previous.pop((namespace, pool), None)
        self._store.remove_source(gateway_source(namespace, pool))

    def _times(self) -> tuple[float, float]:
        """The evaluation time sent (whole milliseconds: exactly the one compared with later) and now.
        Taken when the round starts, in its namespace's slot (see _loop), never before waiting for one."""
        return round(self._wall() * 1000) / 1000, self._clock()

    async def _series(self, promql: str, at: float, purpose: str) -> list[Sample]:
        answer = await self._client.query(promql, at, purpose)
        return await worked_for_answer(len(answer), samples_with_times, answer)

    async def collect_gateway_once(self, namespace: str, pool: str) -> bool:
        """Query one InferencePool's endpoint-picker series now and store them. True when Prometheus answered.

        One page per pool (source gateway_source, kind PROMETHEUS_GATEWAY): a ReplicaQueue per EPP
        replica with fresh series, and a ReplicaLost per replica seen before whose series are gone while
        Prometheus' `up` says its target is still there (down, frozen, or scraped without them): such a
        replica may hold requests, so the evaluation counts it as unread, never as 0. A replica whose
        target Prometheus dropped (the pod was deleted) is gone. Ages as for inference series: nothing
        older than the sample window is used, and the page is as old as its oldest sample kept.
        """
        at, now = self._times()
        query = PrometheusQuery(GATEWAY_SERIES, namespace, pool)
        source = gateway_source(namespace, pool)
        self._store.add_source(source, SourceKind.PROMETHEUS_GATEWAY, namespace)
        seen = self._gateway_replicas.setdefault((namespace, pool), {})
        try:
            samples = await self._series(gateway_query(namespace, pool), at, "gateway")
            found = await worked_for_answer(
                len(samples), gateway_replicas, samples, namespace, at, self._window
            )
            tables = await worked_for_answer(len(samples), replica_tables, found.by_pod)
            ups = await self._ups_of_lost(namespace, seen, found, at)
        except PrometheusError as error:
            return self._failed(query, source, error)
        self._answered(query, samples, at)
        stale = set(found.stale)
        fresh = {name for name, _ in found.by_pod}
        missing: list[ReplicaLost] = []
        for name in sorted(n for n in seen if n not in fresh):
            why = lost_pod(namespace, name, seen[name], name in stale, ups, at, self._window, EPP_SERIES)
            if why is None:
                del seen[name]  # Prometheus no longer has its target: the replica is gone
            else:
                missing.append(ReplicaLost(namespace, name, why))
        queues: list[Reading] = []
        previous = self._gateway_previous.get((namespace, pool), {})
        kept: dict[str, QueueTable] = {}
        for name, read in tables.items():
            seen[name] = found.targets.get(name, frozenset())
            if isinstance(read, NotAGatewayPage):
                queues.append(ReplicaLost(namespace, name, str(read)))
            else:
                kept[name] = since(previous.get(name), read)
                queues.append(ReplicaQueue(namespace, pool, name, kept[name]))
        # A replica missing from this answer but not gone keeps its last queue as the baseline: what it
        # turned away meanwhile shows as growth when its series are back.
        self._gateway_previous[(namespace, pool)] = {
            **{n: t for n, t in previous.items() if n in seen},
            **kept,
        }
        collected_at = _collected_at(now, at, found.oldest)
        by_namespace: dict[str, tuple[Reading, ...]] = {namespace: (*queues, *missing)}
        self._store.record_page(Page(source, collected_at, by_namespace))
        return True

    async def _ups_of_lost(
        self, namespace: str, seen: dict[str, frozenset[Target]], found: FreshSeries, at: float
    ) -> list[Up]:
        """Prometheus' `up` series for the pods (or replicas) seen before without fresh series now."""
        fresh = {name for name, _ in found.by_pod}
        lost = sorted(name for name in seen if name not in fresh)
        if not lost:
            return []
        asked = {t for name in lost for t in seen[name] | found.targets.get(name, frozenset())}
        return up_series(await self._series(up_query(namespace, lost, asked), at, "up"))

    def _failed(self, query: PrometheusQuery, source: str, error: PrometheusError) -> bool:
        """A query without an answer: recorded on its source; said once in the log, until it answers."""
        message = str(error)
        self._store.record_failure(source, message)
        if query not in self._failing:
            self._failing.add(query)
            log.warning("Prometheus source, %s: %s", query_name(query), message)
        return False

    def _answered(self, query: PrometheusQuery, samples: Sequence[Sample], at: float) -> None:
        if samples and all(s.timestamp_ms == round(at * 1000) for s in samples):
            self._no_sample_times()
        if query in self._failing:
            self._failing.discard(query)
            log.info("Prometheus source, %s: answering again", query_name(query))

    async def collect_once(self, namespace: str) -> bool:
        """Query Prometheus for one namespace now and store the result. True when Prometheus answered."""
        at, now = self._times()
        source = namespace_source(namespace)
        self._store.add_source(source, SourceKind.PROMETHEUS, namespace)
        known = self._targets.setdefault(namespace, {})
        try:
            trusted = self._exporter_namespaces
            samples = await self._series(namespace_query(namespace, trusted), at, "namespace")
            for query in await worked_for_answer(len(samples), gpu_queries, samples, trusted):
                more = await self._series(query, at, "gpus")
                samples = await worked_for_answer(len(samples) + len(more), merged, samples, more)
            by_target = await worked_for_answer(len(samples), target_pages, samples, at, self._window)
            lost = [target for target in known if target not in by_target]
            alive = await live_targets(self._client, lost, at, self._window) if lost else set()
            silent = await unattributed_targets(self._client, namespace, alive, at) if alive else set()
            down = [target for target in lost if target not in alive]
            ups = up_series(await self._series(up_query(namespace, (), down), at, "up")) if down else []
            if not by_target and not known:
                await self._check_fleet(at)
        except PrometheusError as error:
            # Said once, on the namespace's source; the targets' pages just age ("last data 5.2s old").
            return self._failed(PrometheusQuery(GPU_SERIES, namespace), source, error)
        self._answered(PrometheusQuery(GPU_SERIES, namespace), samples, at)

        for target, (as_of, readings) in by_target.items():
            self._record_target(namespace, target, now - max(0.0, at - as_of), readings)
        for target in lost:
            state = known[target]
            # Still scraped, its GPU series naming pods but none of the namespace: those pods are gone;
            # naming none at all, an attribution outage. Otherwise Prometheus' `up` decides: down or without
            # GPU series, a failing source for as long as that lasts; no target any more, its pods gone.
            why = (
                ATTRIBUTION_LOST
                if target in silent
                else None
                if target in alive
                else lost_target(target, ups, at, self._window)
            )
            if why is None:
                self._store.remove_source(state.source)
                del known[target]
            else:
                self._store.record_failure(state.source, f"no current series in Prometheus: {why}")
        # Empty, but under the namespace's name: waiters on that namespace hear of failures and recoveries.
        self._store.record_page(Page(source, now, {namespace: ()}))
        return True

    async def collect_inference_once(self, namespace: str) -> bool:
        """Query the namespace's inference-server series now and store them. True when Prometheus answered.

        One query, one page: source inference_source(namespace), kind PROMETHEUS_INFERENCE, holding one
        PodSamples per pod that has fresh series (prometheus_answer.inference_pods). Ages stay honest:
        a series older than the sample window is never used, and a pod with nothing fresher is left out
        of the page, so the evaluator sees it as a pod without data (missing) rather than reading old
        values; the page is as old as its oldest sample kept, so it turns stale when that sample would.
        No engine series at all is a page with no pods (the evaluator's zero-pod rules decide); only an
        answer Prometheus failed to give is a failure, recorded on the same source.

        A pod the page named before and has no fresh series now is decided by Prometheus' own `up` series
        (prometheus_answer.lost_pod): while its server is down or its series are frozen it gets a failing
        source of its own (pod_inference_source), which makes it a missing pod without Kubernetes (one
        stopped server cannot shrink the value, SPEC §4); once Prometheus no longer has its scrape target
        (the pod was deleted) that source goes, and so does the pod. Fresh again: the source goes too.
        """
        at, now = self._times()
        source = inference_source(namespace)
        self._store.add_source(source, SourceKind.PROMETHEUS_INFERENCE, namespace)
        seen = self._inference_pods.setdefault(namespace, {})
        try:
            trusted = self._exporter_namespaces
            samples = await self._series(inference_query(namespace, trusted), at, "inference")
            found = await worked_for_answer(
                len(samples), inference_pods, samples, namespace, at, self._window, trusted
            )
            ups = await self._ups_of_lost(namespace, seen, found, at)
            own_ups = await worked_for_answer(len(samples), up_series, samples)
            down = down_pods(namespace, seen.keys(), found, own_ups, at, self._window)
        except PrometheusError as error:
            return self._failed(PrometheusQuery(INFERENCE_SERIES, namespace), source, error)
        self._answered(PrometheusQuery(INFERENCE_SERIES, namespace), samples, at)
        served_by = found.targets
        fresh = {pod for pod, _ in found.by_pod}
        lost = sorted(pod for pod in seen if pod not in fresh)
        if found.stale:
            log.debug(
                "Prometheus source, namespace %s: no fresh inference series for pods %s",
                namespace,
                ", ".join(found.stale[:10]),
            )
        collected_at = _collected_at(now, at, found.oldest)
        # Elements of this kind are PodSamples, not GPU readings (store.SourceKind.PROMETHEUS_INFERENCE).
        pods = tuple(PodSamples(namespace, pod, series) for pod, series in found.by_pod)
        by_namespace: dict[str, tuple[Reading, ...]] = {namespace: pods}
        self._store.record_page(Page(source, collected_at, by_namespace))
        # With the page, in the same step: no evaluation sees the pod gone from both.
        missing = self._inference_missing.setdefault(namespace, set())
        for pod in fresh:
            seen[pod] = served_by.get(pod, frozenset())
            if pod in missing:
                missing.discard(pod)
                self._store.remove_source(pod_inference_source(namespace, pod))
                log.info("Prometheus source, namespace %s: pod %s has fresh series again", namespace, pod)
        stale = set(found.stale)
        for pod in lost:
            self._lost_pod(namespace, pod, seen, served_by, pod in stale, ups, at)
        for pod, why in down.items():
            self._missing_pod(namespace, pod, why)
        for pod in sorted(missing - seen.keys() - down.keys()):
            # Never read, and its target is no longer down (or no longer there): it counts no more.
            missing.discard(pod)
            self._store.remove_source(pod_inference_source(namespace, pod))
        return True

    def _lost_pod(
        self,
        namespace: str,
        pod: str,
        seen: dict[str, frozenset[Target]],
        served_by: dict[str, frozenset[Target]],
        stale: bool,
        ups: list[Up],
        at: float,
    ) -> None:
        """A pod seen on the namespace's page without fresh series now: missing (a failing source) or gone."""
        source = pod_inference_source(namespace, pod)
        targets = seen[pod] | served_by.get(pod, frozenset())
        reason = lost_pod(namespace, pod, targets, stale, ups, at, self._window)
        missing = self._inference_missing.setdefault(namespace, set())
        if reason is None:
            self._store.remove_source(source)
            del seen[pod]
            missing.discard(pod)
            log.info(
                "Prometheus source, namespace %s: pod %s is gone (no scrape target serves it)", namespace, pod
            )
            return
        self._missing_pod(namespace, pod, reason)

    def _missing_pod(self, namespace: str, pod: str, reason: str) -> None:
        """The pod counts as missing (a failing source of its own) for as long as this is said each round."""
        missing = self._inference_missing.setdefault(namespace, set())
        if pod not in missing:
            missing.add(pod)
            log.info("Prometheus source, namespace %s: pod %s counts as missing: %s", namespace, pod, reason)
        source = pod_inference_source(namespace, pod)
        self._store.add_source(source, SourceKind.PROMETHEUS_INFERENCE, namespace, pod=pod)
        self._store.record_failure(source, reason)

    def _no_sample_times(self) -> None:
        # A server whose timestamp() gives the evaluation time rather than the sample's own makes every
        # series look fresh: its staleness handling then stands alone. Say so once.
        if not self._told_no_sample_times:
            self._told_no_sample_times = True
            log.warning(
                "the Prometheus API reports every sample as taken at the query time: the age of its data"
                " cannot be checked against --max-staleness"
            )

    def _record_target(
        self, namespace: str, target: Target, collected_at: float, readings: list[GpuReading]
    ) -> None:
        known = self._targets[namespace]
        state = known.get(target)
        if state is None:
            job, instance = target
            name = (
                f"{namespace_source(namespace)} {job}/{instance}"
                if job or instance
                else f"{namespace_source(namespace)} (no job/instance)"
            )
            state = known[target] = _TargetSource(name, collected_at)
            self._store.add_source(name, SourceKind.PROMETHEUS, namespace)
        state.collected_at = collected_at
        self._store.record_page(Page.from_readings(state.source, collected_at, readings))

    async def _check_fleet(self, at: float) -> None:
        """A namespace without any series is 0 only when Prometheus holds GPU series at all.

        Otherwise a Prometheus that does not scrape the exporters (a wrong URL, a broken ServiceMonitor)
        would read as "no pods" everywhere, and KEDA would scale every workload to zero.
        """
        if at < self._fleet_seen_until:
            return
        if not await self._client.query(fleet_query(), at, "fleet"):
            raise PrometheusError(
                "Prometheus holds no current series of any GPU exporter family: is it scraping the exporters?"
            )
        # Nor while an exporter is down: its node's pods are in no series (SPEC §4: zero pods is an answer
        # only while every exporter answers). Pods seen before are missing pods; this covers a start.
        if down := await self._client.query(down_exporters_query(), at, "exporters down"):
            targets = sorted(f"{e.labels.get('job', '')}/{e.labels.get('instance', '')}" for e in down)
            more = f" and {len(targets) - 3} more" if len(targets) > 3 else ""
            raise PrometheusError(
                f"no series name a pod of this namespace while a GPU exporter job's scrape target is down"
                f" in Prometheus (up 0): {', '.join(targets[:3])}{more}; its pods cannot be told from none"
            )
        self._fleet_seen_until = at + self._interval


def _collected_at(now: float, at: float, oldest: float | None) -> float:
    """A page is as old as its oldest sample kept (now, when it keeps none)."""
    return now if oldest is None else now - max(0.0, at - oldest)
