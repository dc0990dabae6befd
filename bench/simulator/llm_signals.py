"""What each collector saw, and when: the scaler's own scrape of the pods, Prometheus, the GPU exporter,
and the gateway's queue page. Policies read these views, never the fleet itself."""

from __future__ import annotations

import bisect
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TypeVar

from bench.simulator.autoscaling import due
from bench.simulator.llm_fleet import Fleet
from bench.simulator.llm_product import Page, SimulatedScaler
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb  # KEDA's wire messages

T = TypeVar("T")


@dataclass(frozen=True)
class View:
    at: float
    pages: dict[str, Page] = field(default_factory=dict)  # Ready pods only: a starting pod has no page yet
    targets: tuple[str, ...] = ()  # the Deployment's Ready pods (SPEC §4's target pods)
    starting: tuple[str, ...] = ()  # its pods that exist but are not Ready yet
    pending: int = 0  # requests the gateway holds
    utilization: dict[str, float] = field(default_factory=dict)  # the GPU exporter's last values, %


@dataclass(frozen=True)
class Timing:
    """Collector periods and phases (s); phases differ so no two loops tick in lockstep."""

    scrape_interval: float = 5.0  # the scaler's --scrape-interval default
    scrape_phase: float = 2.0
    gateway_interval: float = 1.0  # the scaler's --gateway-interval default
    prometheus_interval: float = 15.0  # a common Prometheus scrape interval (15–30 s)
    prometheus_phase: float = 4.0
    exporter_refresh: float = 30.0  # dcgm-exporter's default collection interval
    exporter_phase: float = 0.0
    hpa_phase: float = 7.0
    keda_phase: float = 11.0
    rule_interval: float = 15.0  # Prometheus's rule evaluation_interval (recording rules' values)
    rule_phase: float = 9.0
    latency_window: float = 60.0  # the recording rules' rate(…_bucket[1m]) behind the latency p90s
    history: float = 60.0  # how far back Prometheus views are kept (the saturation analyser's [1m])
    scrape_history: float = 300.0  # how far back the scaler's own scrapes are kept (demand's window)


def random_timing(seed: int, step: float, hpa_sync: float = 15.0, keda_polling: float = 30.0) -> Timing:
    """Every loop at its own seeded random phase, on the simulator's `step` grid: in a cluster the scaler's
    scrape, Prometheus's scrape and rules, KEDA's poll and the HPA's sync are not aligned, so the data a
    decision reads is somewhere between fresh and one interval old."""
    rng = random.Random(seed ^ 0x7A5E)
    t = Timing()

    def phase(period: float) -> float:
        return step * rng.randrange(round(period / step))

    return replace(
        t,
        scrape_phase=phase(t.scrape_interval),
        prometheus_phase=phase(t.prometheus_interval),
        exporter_phase=phase(t.exporter_refresh),
        rule_phase=phase(t.rule_interval),
        hpa_phase=phase(hpa_sync),
        keda_phase=phase(keda_polling),
    )


class Signals:
    def __init__(self, timing: Timing) -> None:
        self.timing = timing
        self.now = 0.0
        self.direct = View(-1.0)
        self.prometheus = View(-1.0)
        self.history: deque[View] = deque()
        self.pending = 0  # the gateway page as the scaler last read it
        self.pending_history: deque[tuple[float, int]] = deque()  # (time, pending) of each gateway read
        # The recording rules' last values: p90 TTFT and p90 time per output token (s) over the latency
        # window behind Prometheus's last scrape (None: no request finished in it), and that scrape's view.
        self._latency_p90: tuple[float, float] | None = None
        self._latency_span: tuple[Fleet, int, int] | None = (
            None  # the requests the last rules judged, unsorted
        )
        self.recorded = View(-1.0)
        self.rule_at = -1.0  # when the rules last ran
        self.scrapes: deque[View] = deque()  # the scaler's own scrapes, newest last
        # What the API server says now (discovery's watch follows each change within moments).
        self.ready: tuple[str, ...] = ()
        self.starting: tuple[str, ...] = ()
        self._cluster: LlmCluster | None = None
        self._utilization: dict[str, float] = {}
        self._busy: dict[str, tuple[float, float]] = {}  # pod → (busy seconds, time) at the last refresh

    def tick(self, now: float, fleet: Fleet) -> tuple[bool, bool]:
        """Run the collectors due now; returns (the gateway page was read, Prometheus scraped)."""
        t = self.timing
        self.now = now
        self.ready = tuple(p.name for p in fleet.ready_pods())
        self.starting = tuple(p.name for p in fleet.starting_pods())
        if due(now, t.exporter_refresh, t.exporter_phase):
            self._refresh_exporter(now, fleet)
        if due(now, t.scrape_interval, t.scrape_phase):
            self.direct = self._view(now, fleet)
            self.scrapes.append(self.direct)
            while self.scrapes[0].at < now - t.scrape_history:
                self.scrapes.popleft()
        gateway = due(now, t.gateway_interval, 0.0)
        if gateway:
            self.pending = len(fleet.gateway)
            self.pending_history.append((now, self.pending))
            while self.pending_history[0][0] < now - t.scrape_history:
                self.pending_history.popleft()
        scraped = due(now, t.prometheus_interval, t.prometheus_phase)
        if scraped:
            self.prometheus = self._view(now, fleet)
            self.history.append(self.prometheus)
            while self.history[0].at <= now - t.history:
                self.history.popleft()
        if due(now, t.rule_interval, t.rule_phase):
            self.recorded, self.rule_at = self.prometheus, now
            self._latency_span = _latency_span(fleet, self.prometheus.at, t.latency_window)
        return gateway, scraped

    @property
    def latency_p90(self) -> tuple[float, float] | None:
        """The recording rules' last p90s, sorted out when first read: most policies never read them."""
        if self._latency_span is not None:
            self._latency_p90, self._latency_span = _latency_p90(*self._latency_span), None
        return self._latency_p90

    @latency_p90.setter
    def latency_p90(self, value: tuple[float, float] | None) -> None:
        self._latency_p90, self._latency_span = value, None

    @property
    def cluster(self) -> LlmCluster:
        """This product, fed the pages collected so far, made when a policy first asks it."""
        if self._cluster is None:
            self._cluster = LlmCluster()
        return self._cluster

    def _view(self, now: float, fleet: Fleet) -> View:
        pages = {
            p.name: Page(
                p.batch,
                p.waiting,
                p.kv_usage(),
                p.finished,
                p.prompt_tokens,
                p.generation_tokens,
                p.request_prompt_sum,
                p.request_output_sum,
                p.ttft_sum,
                p.ttft_count,
                p.tpot_sum,
                tuple(p.ttft_buckets),
                tuple(p.tpot_buckets),
            )
            for p in fleet.ready_pods()
        }
        targets = tuple(pages)
        starting = tuple(p.name for p in fleet.starting_pods())
        utilization = {p.name: self._utilization.get(p.name, 0.0) for p in fleet.pods}
        return View(now, pages, targets, starting, len(fleet.gateway), utilization)

    def _refresh_exporter(self, now: float, fleet: Fleet) -> None:
        """DCGM_FI_DEV_GPU_UTIL: the share of the last interval a kernel ran, per pod's GPU."""
        values, busy = {}, {}
        for pod in fleet.pods:
            before, since = self._busy.get(pod.name, (0.0, pod.created))
            window = now - since
            values[pod.name] = min(100.0, 100.0 * (pod.busy - before) / window) if window > 0 else 0.0
            busy[pod.name] = (pod.busy, now)
        self._utilization, self._busy = values, busy


def _latency_span(fleet: Fleet, at: float, window: float) -> tuple[Fleet, int, int]:
    """Where the requests finished in (at − window, at] sit in the fleet's tally (which only grows)."""
    done_at = fleet.tally.done_at
    return fleet, bisect.bisect_right(done_at, at - window), bisect.bisect_right(done_at, at)


def _latency_p90(fleet: Fleet, first: int, last: int) -> tuple[float, float] | None:
    """p90 of TTFT and of time per output token over the tally's requests first … last − 1."""
    tally = fleet.tally
    if last <= first:
        return None
    ttfts = sorted(tally.done_ttft[first:last])
    tpots = sorted(tally.done_tpot[first:last])
    index = max(0, -(-9 * len(ttfts) // 10) - 1)
    return ttfts[index], tpots[index]


def _newer(history: deque[T], fed: float, at: Callable[[T], float]) -> list[T]:
    """The entries of a history (oldest first, times rising) after time `fed`, oldest first: found from
    the newest end, as an ask hands over a few of the hundreds a history holds."""
    newer = []
    for entry in reversed(history):
        if at(entry) <= fed:
            break
        newer.append(entry)
    return newer[::-1]


class LlmCluster:
    """The LLM simulator's collectors' views handed to the product, oldest first, when a value is asked."""

    def __init__(self) -> None:
        self.scaler = SimulatedScaler()
        self.read_utilization = False  # a GPU-utilisation trigger is followed: exporters are scraped
        self._fed = -math.inf
        self._fed_gateway = -math.inf

    def ask(self, signals: Signals, metadata: dict[str, str]) -> pb.ScaledObjectRef:
        """Follow the trigger, hand over what was collected since the last call, set the cluster to now."""
        scaler = self.scaler
        ref = scaler.follow(metadata)
        self.read_utilization |= metadata.get("metric") == "utilization"
        for view in _newer(signals.scrapes, self._fed, lambda view: view.at):
            scaler.scrape_pods(view.at, view.pages)
            if self.read_utilization:
                scaler.scrape_exporters(view.at, {p: view.utilization.get(p, 0.0) for p in view.pages})
            self._fed = view.at
        for at, pending in _newer(signals.pending_history, self._fed_gateway, lambda read: read[0]):
            scaler.read_gateway(at, pending, len(signals.ready))
            self._fed_gateway = at
        scaler.cluster(signals.now, signals.ready, signals.starting)
        return ref

    def metric(self, signals: Signals, metadata: dict[str, str]) -> float | None:
        return self.scaler.metric(self.ask(signals, metadata))

    def active(self, signals: Signals, metadata: dict[str, str]) -> bool | None:
        return self.scaler.active(self.ask(signals, metadata))

    def target(self, signals: Signals, metadata: dict[str, str]) -> float:
        return self.scaler.target(self.ask(signals, metadata))
