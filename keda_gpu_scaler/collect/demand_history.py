"""The pages `metric: demand` takes rates over: per wanted pod page, one point per read over its window.

A rate needs each page at two instants, and the store keeps only the last one. This module listens to the
store (Store.page_listeners / removal_listeners) and keeps, for each pod page (pod, port and path: its
URL, as the store names every reading's source) that a `demand` trigger asked about, a point per page
read. A point is worked out once, as the page arrives, however many triggers, models and engine choices
read it. Rates are taken per series, as Prometheus' `sum(rate())` takes them: every counter series (its
family, model and split labels: engine, finish reason, version) is taken against its own last value; a
series that goes down restarted and counts from 0 where its new value could have been counted since a
restart in the time since its last page (at most half its last value, or at most its own recent rate
times that time), else the step back is a recount (a new baseline); one that appears starts a baseline
(it adds nothing on its first page), one that vanishes leaves without a step (one missing from a few
pages, as a NaN sample makes it, is stepped against its last value when it returns). The steps add up into
running totals per (role, model) that never go down, so any model's rate is read from the window's two
ends; a total whose series are gone is dropped once every point kept holds it at its last value (it moves
no rate). The in-flight gauges are read at those two ends, for the trigger's engine and model, from the
pages kept by reference (the store held the same objects): their change is the pod's sum, so requests an
engine held when it restarted (lost, never finished) read as less demand, at most what it held over one
window, never as more.

It stays bounded: only pages a trigger asks about keep points, only the last window's (capped), one
history per page and engine format (one in practice); a page's points go with its page source, or once no
trigger has asked for them for `forget_after` seconds. The newest page of every inference pod is
remembered by reference so that a page asked about for the first time starts with one point, not none.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from keda_gpu_scaler.collect.store import Page
from keda_gpu_scaler.core.demand import DemandPoint, over_window
from keda_gpu_scaler.core.snapshot import SourceKind, Track
from keda_gpu_scaler.pages.engines import (
    DemandCounters,
    Missing,
    MissingKind,
    PodSamples,
    Value,
    counters_format,
    counters_of,
    in_flight,
    pod_counters,
    pod_reading,
)
from keda_gpu_scaler.pages.engines._common import LATENCY_KINDS, SIZE_ROLES, Series, model_of
from keda_gpu_scaler.pages.exposition import Sample

PageKey = tuple[str, str, str]
"""(namespace, pod, page source): one page of one pod."""
TotalKey = tuple[str, str]
"""(role, model): a running total, the role one of FINISHED, PROMPT, GENERATION or SIZE_ROLES."""
FINISHED, PROMPT, GENERATION = "finished", "prompt", "generation"

# At most this many points per page whatever the window (600 s at a 1 s scrape interval): a bound on
# memory that no configuration can lift.
MAX_POINTS = 1024
# A series that goes down restarted (counted from 0, as Prometheus does) where its new value could have
# been counted since a restart within the time since its last page: it is at most this fraction of its
# last value, or at most what the series counts at its own recent rate over that time. Else it is a
# recount (a new baseline): one copy of a series read instead of another, a large total a little lower.
# The fraction stands where no rate is known yet (a restart within one scrape interval cannot count back
# up to more than half of what the series counted over its whole life before); the rate is what tells a
# young server's restart, or one across a page outage (rates are taken across one: counters keep
# counting), from a recount: a recount lands near the last value, far above what the gap can count.
RESTART_FRACTION = 0.5
# How often histories nobody asks for any more are looked for (seconds of page time).
SWEEP_EVERY = 30.0
_INFERENCE_KINDS = frozenset({SourceKind.INFERENCE})


@dataclass(frozen=True, slots=True)
class PagePoint:
    """One page read: when, the page (by reference, for its gauges), and the running totals then."""

    at: float
    page: PodSamples
    totals: Mapping[TotalKey, float]
    # The finished-requests series that went down on this page (model, "label=value"...): restarts.
    restarted: frozenset[tuple[str, ...]] = frozenset()


@dataclass(slots=True)
class SeriesHistory:
    """One page read with one engine format: its points over the window, oldest first."""

    window: float
    points: list[PagePoint] = field(default_factory=list)
    last_values: Mapping[tuple[str, ...], float] = field(default_factory=dict)
    # Each series' count per second over its last step (what it added over the time between the pages).
    last_rates: Mapping[tuple[str, ...], float] = field(default_factory=dict)
    values_at: float = float("-inf")  # when last_values were read
    # Series on an earlier page but not on the last ones (a NaN sample drops its role from a page): their
    # last value, when it was read and their rate then, while a kept point is as old (see add()).
    absent: dict[tuple[str, ...], tuple[float, float, float]] = field(default_factory=dict)
    running: dict[TotalKey, float] = field(default_factory=dict)
    last_at: float = float("-inf")

    def add(self, at: float, page: PodSamples, counters: DemandCounters) -> None:
        """A page read: each series' step since its last value added to its (role, model) total.

        A series missing from a page (one NaN sample makes its whole role unusable there) keeps its last
        value while the points kept reach back to when it was read: back, it is stepped against that value,
        as Prometheus' rate() steps over a missing sample; taken as a new baseline, its increase meanwhile
        was lost (0 → 1000 → NaN → 3000 read 1000). Absent longer, it left without a step and its return
        starts a baseline: churn (adapters loaded and unloaded) keeps no more than a window's series."""
        if at <= self.last_at:
            return  # the same page again
        self.last_at = at
        values = _by_role(counters)
        if values is None:
            return  # no usable counters: the next page's steps are taken against the last usable one
        restarted = set()
        rates: dict[tuple[str, ...], float] = {}
        absent = self.absent
        steps: dict[tuple[str, ...], tuple[float, float, bool]] = {}  # key → (step, gap, restarted)
        for key, value in values.items():
            self.running.setdefault((key[0], key[2]), 0.0)
            before = self.last_values.get(key)
            if before is not None:
                gap, last_rate = at - self.values_at, self.last_rates.get(key, 0.0)
            elif absent and (held := absent.pop(key, None)) is not None:
                before, seen_at, last_rate = held
                gap = at - seen_at
            else:
                continue  # a series that appears starts a baseline
            if value >= before:
                steps[key] = (value - before, gap, False)
            elif value <= before * RESTART_FRACTION or value <= last_rate * gap:
                # A restarted server counts from 0: what it counted since arrived since.
                steps[key] = (value, gap, True)
            else:
                steps[key] = (0.0, gap, False)  # a recount (see RESTART_FRACTION): a new baseline
        # A histogram restarts whole: a bucket that had counted little before a restart can be back above
        # its last value and read as growth while its _count restarted, and the difference would read as
        # observations in the buckets above it (late first tokens that never were).
        restarted_histograms = {_histogram_of(key) for key, (_, _, again) in steps.items() if again} - {None}
        for key, (step, gap, again) in steps.items():
            if not again and restarted_histograms and _histogram_of(key) in restarted_histograms:
                step, again = values[key], True
            if again and key[0] == FINISHED:
                restarted.add(key[2:])
            self.running[(key[0], key[2])] += step
            rates[key] = step / gap
        if values.keys() != self.last_values.keys():
            for key in self.last_values.keys() - values.keys():
                absent[key] = (self.last_values[key], self.values_at, self.last_rates.get(key, 0.0))
        self.last_values, self.last_rates, self.values_at = values, rates, at
        self.points.append(PagePoint(at, page, dict(self.running), frozenset(restarted)))
        keep = over_window(self.points, self.window)
        if len(keep) < len(self.points) or len(self.points) > MAX_POINTS:
            self.points = list(keep)[-MAX_POINTS:]
        if absent:
            oldest = self.points[0].at
            self.absent = {key: held for key, held in absent.items() if held[1] >= oldest}
        self._forget_gone(values)

    def _forget_gone(self, values: Mapping[tuple[str, ...], float]) -> None:
        """Drops the totals whose series are all gone from the page and that every kept point holds at
        their last value (or not at all): no rate between two kept points reads them (the same total at
        both ends), so removed from every point and from the running totals they change no rate. Without
        this, series churn (adapters loaded and unloaded, model names changing) would grow the totals, and
        each point's copy of them, for as long as a trigger asks. A total only grows where its series is
        on the page, so one gone stays put; its series coming back adds its step (see add()) to the total
        started again from 0, which every point kept before reads as 0: the same increase."""
        oldest = self.points[0].totals
        live = {(key[0], key[2]) for key in values}
        gone = {
            total
            for total, value in self.running.items()
            if total not in live and oldest.get(total, 0.0) == value  # totals never go down: all equal
        }
        if not gone:
            return
        for total in gone:
            del self.running[total]
        self.points = [
            dataclasses.replace(point, totals={k: v for k, v in point.totals.items() if k not in gone})
            if not gone.isdisjoint(point.totals)
            else point
            for point in self.points
        ]


def _histogram_of(key: tuple[str, ...]) -> tuple[str, ...] | None:
    """The histogram a series belongs to (its name, model and split values), or None for a counter: the
    latency roles `KIND:le=…`, `KIND:sum`, `KIND:count`, and the size roles `prompt_sum`, `prompt_count`…"""
    role = key[0]
    if ":" in role:
        return (role.split(":", 1)[0], *key[2:])
    if role in SIZE_ROLES:
        return (role.rsplit("_", 1)[0], *key[2:])
    return None


def _by_role(counters: DemandCounters) -> dict[tuple[str, ...], float] | None:
    """Every series of a page's counters keyed (role, family, model, split values...); None without a
    usable counter of finished requests."""
    if isinstance(counters.finished, Missing):
        return None
    roles: list[tuple[str, Series | Missing]] = [
        (FINISHED, counters.finished),
        (PROMPT, counters.prompt_tokens),
        (GENERATION, counters.generation_tokens),
    ]
    values: dict[tuple[str, ...], float] = {}
    for role, series in roles:
        if not isinstance(series, Missing):
            values.update(((role, *key), value) for key, value in series.items())
    for histograms in (counters.sizes, counters.latency):
        values.update(((key[0], *key), value) for key, value in histograms.items())
    return values


@dataclass(slots=True)
class PageHistory:
    """One pod page: its newest read, and its points per engine format while a trigger asks for them."""

    newest: tuple[float, PodSamples]
    wanted_at: float = float("-inf")
    by_format: dict[int, SeriesHistory] = field(default_factory=dict)


def demand_point(
    page: PodSamples, key: tuple[str, str | None], at: float
) -> tuple[str, DemandPoint | Missing]:
    """What one pod page was read as, and its point for `metric: demand` or why it has none (never a
    made-up 0): the page's own totals (summed over series; the history takes them per series)."""
    reading, counters = pod_counters(page.samples, key[0], key[1])
    engine = reading.engine.value if reading.engine is not None else "unknown"
    flight = in_flight(reading)
    if isinstance(flight, Missing):
        return engine, flight
    if isinstance(counters.finished, Missing):
        return engine, counters.finished
    sizes = _sizes({("", *k): v for k, v in counters.sizes.items()}, key[1]) if counters.sizes else None
    return engine, DemandPoint(
        at,
        _sum(counters.finished),
        flight,
        None if isinstance(counters.prompt_tokens, Missing) else _sum(counters.prompt_tokens),
        None if isinstance(counters.generation_tokens, Missing) else _sum(counters.generation_tokens),
        sizes,
    )


def _latency_increases(ends: Sequence[PagePoint], model: str | None) -> dict[str, float]:
    """Each latency role's increase between the window's two ends (a series that appeared within it
    counts from 0: its running total starts there)."""
    if len(ends) < 2:
        return {}
    first, last = ends[0].totals, ends[-1].totals
    increases: dict[str, float] = {}
    for (role, series_model), total in last.items():
        if role.split(":", 1)[0] in LATENCY_KINDS and (model is None or series_model == model):
            increases[role] = increases.get(role, 0.0) + total - first.get((role, series_model), 0.0)
    return increases


def _lost(points: Sequence[PagePoint], engine: str, model: str | None) -> float:
    """The requests in flight, on the page before, in the engines whose finished counters went down."""
    lost = 0.0
    for before, after in itertools.pairwise(points):
        restarted = [r for r in after.restarted if model is None or r[0] == model]
        if not restarted:
            continue
        held = [s for s in before.page.samples if any(_of_series(s, series) for series in restarted)]
        flight = in_flight(pod_reading(held, engine, model))
        lost += 0.0 if isinstance(flight, Missing) else flight
    return lost


def _of_series(sample: Sample, series: tuple[str, ...]) -> bool:
    """Whether a gauge sample is of the engine a counter series (model, "label=value"...) counts: its
    model, and each of the series' labels that the gauge carries too (vLLM's `engine`, Triton's `version`);
    a label the gauge prints empty is one it does not carry (SGLang's gauges print `priority=""`)."""
    if model_of(sample.labels) != series[0]:
        return False
    pairs = (pair.split("=", 1) for pair in series[1:])
    return all((sample.labels.get(label) or value) == value for label, value in pairs)


def _sum(series: Series) -> float:
    return sum(series.values(), 0.0)


def _sizes(totals: Mapping[tuple[str, ...], float], model: str | None) -> tuple[float, float, float, float]:
    """The per-request histograms' four totals (SIZE_ROLES) of `model` (None: every model)."""
    parts = [
        sum((v for k, v in totals.items() if k[1] == role and (model is None or k[2] == model)), 0.0)
        for role in SIZE_ROLES
    ]
    return parts[0], parts[1], parts[2], parts[3]


_UNREAD_COUNTERS = Missing(MissingKind.NO_VALUE, "a counter on its newest page has no value (NaN)")


class DemandHistory:
    """Per wanted pod page, the points of its last window (see the module docstring)."""

    def __init__(self, *, forget_after: float) -> None:
        self._forget_after = forget_after
        self._pages: dict[PageKey, PageHistory] = {}
        self._swept_at = float("-inf")

    def __len__(self) -> int:
        """How many histories with points are kept (one per page and engine format; for tests)."""
        return sum(len(page.by_format) for page in self._pages.values())

    def read(self, page: PodSamples, engine: str, model: str | None, window: float, now: float) -> Track:
        """A pod page read as (engine, model) over `window`, its points kept from now on (an evaluation
        asks for every target pod's page)."""
        history = self._pages.get((page.namespace, page.pod, page.source))
        if history is None:
            return Track([])
        history.wanted_at = now
        newest_at, newest = history.newest
        # Its latency comes from the points' totals: the newest page's own latency histograms go unread.
        reading, counters = pod_counters(newest.samples, engine, model, latency=False)
        engine_name = reading.engine.value if reading.engine is not None else "unknown"
        flight = in_flight(reading)
        problem = flight if isinstance(flight, Missing) else None
        if problem is None and isinstance(counters.finished, Missing):
            problem = counters.finished
        index = counters_format(newest.samples, engine)
        if problem is not None or index is None:
            return Track([], problem=problem, engine=engine_name)
        series = history.by_format.get(index)
        if series is None:
            series = history.by_format[index] = SeriesHistory(window)
            series.add(newest_at, newest, counters_of(newest, index))
        series.window = max(series.window, window)
        points = over_window(series.points, window)
        if not points or points[-1].at < newest_at:
            # The newest page added no point (a NaN in a counter of any of its models): a rate would end
            # at an older page, however old.
            return Track([], problem=_UNREAD_COUNTERS, engine=engine_name)
        # The rate starts at the window's oldest page whose in-flight count can be read (a NaN there
        # shortens the span: a pod with pages enough is never one without a rate of its own).
        ends_at = ((p, self._end(p, engine, model, counters, None)) for p in points[:-1])
        first = next(((p, end) for p, end in ends_at if end is not None), None)
        if first is None and len(points) > 1:
            unread = Missing(
                MissingKind.NO_VALUE, f"no in-flight count on its {len(points) - 1} earlier pages"
            )
            return Track([], problem=unread, engine=engine_name)
        # The newest page's in-flight count was read above (`flight`): its end is never None.
        pairs = [
            *([first] if first else []),
            (points[-1], self._end(points[-1], engine, model, counters, flight)),
        ]
        ends = [point for point, _ in pairs]
        usable = [end for _, end in pairs if end is not None]
        lost = _lost(points, engine, model)
        if len(usable) == 2 and lost:
            # Requests restarted engines held were lost, neither finished nor in flight after: counted as
            # still in flight, so that their arrival is not taken back (a restart counts from empty).
            usable[1] = dataclasses.replace(usable[1], in_flight=usable[1].in_flight + lost)
        unvalued = (c for c in (counters.prompt_tokens, counters.generation_tokens) if isinstance(c, Missing))
        tokens_problem = next((c for c in unvalued if c.kind is MissingKind.NO_VALUE), None)
        return Track(usable, len(points), None, engine_name, _latency_increases(ends, model), tokens_problem)

    @staticmethod
    def _end(
        point: PagePoint, engine: str, model: str | None, newest: DemandCounters, flight: Value | None
    ) -> DemandPoint | None:
        """The rate's end at one point for (engine, model): its totals and the requests in flight then
        (`flight`: already read from that page)."""
        if flight is None:
            flight = in_flight(pod_reading(point.page.samples, engine, model))
        if isinstance(flight, Missing):
            return None

        def of(role: str) -> float:
            return sum(
                (v for (r, m), v in point.totals.items() if r == role and (model is None or m == model)), 0.0
            )

        totals: dict[tuple[str, ...], float] = {("", r, m): v for (r, m), v in point.totals.items()}
        return DemandPoint(
            point.at,
            of(FINISHED),
            flight,
            None if isinstance(newest.prompt_tokens, Missing) else of(PROMPT),
            None if isinstance(newest.generation_tokens, Missing) else of(GENERATION),
            _sizes(totals, model) if newest.sizes else None,
        )

    def on_page(self, kind: SourceKind, page: Page) -> None:
        """Store listener: a page was recorded."""
        if kind not in _INFERENCE_KINDS:
            return
        for reading in page.readings_of(PodSamples):
            key = (reading.namespace, reading.pod, reading.source)
            history = self._pages.get(key)
            if history is None:
                self._pages[key] = PageHistory((page.collected_at, reading))
                continue
            history.newest = (page.collected_at, reading)
            for index, series in history.by_format.items():
                series.add(page.collected_at, reading, counters_of(reading, index))
        if page.collected_at - self._swept_at >= SWEEP_EVERY:
            self._sweep(page.collected_at)

    def on_removed(self, kind: SourceKind, page: Page) -> None:
        """Store listener: a page source is gone (its pod left the targets): its points go too."""
        if kind not in _INFERENCE_KINDS:
            return
        for reading in page.readings_of(PodSamples):
            self._pages.pop((reading.namespace, reading.pod, reading.source), None)

    def _sweep(self, now: float) -> None:
        self._swept_at = now
        for history in self._pages.values():
            if now - history.wanted_at > self._forget_after:
                history.by_format.clear()
