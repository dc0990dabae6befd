"""`keda-gpu-scaler calibrate`: what one replica serves, measured on one pod while a load ramp runs.

The `demand` threshold is the work one replica should serve per second. It depends on the model, the GPU,
the engine's settings and the request mix, so it is measured, not guessed: run a load generator against
one pod with a slowly rising rate, and let this command read the pod's own page every few seconds. It
prints the arrival rate over the last window (requests per second, and weighted tokens per second where
the engine prints token counters) beside the requests waiting and the mean time per output token, and at
the end the highest rate the pod took while nothing waited (and, given a target, while the time per
output token stayed within it): past it, requests queue and latency climbs. A threshold a little below
that figure leaves headroom.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from keda_gpu_scaler.collect.demand_history import DemandHistory
from keda_gpu_scaler.collect.http import FetchError
from keda_gpu_scaler.collect.inference import POD_PAGE_NAMES
from keda_gpu_scaler.collect.store import Page
from keda_gpu_scaler.core.decide import decide
from keda_gpu_scaler.core.demand import DEFAULT_PREFILL_WEIGHT, DemandUnit
from keda_gpu_scaler.core.errors import ConfigError
from keda_gpu_scaler.core.snapshot import NamespaceView, Snapshot, SourceKind, Track
from keda_gpu_scaler.core.trigger_parse import parse_trigger
from keda_gpu_scaler.core.value_parsers import MIN_THRESHOLD
from keda_gpu_scaler.pages.engines import Missing, PodSamples, pod_reading
from keda_gpu_scaler.pages.engines._common import model_of
from keda_gpu_scaler.pages.exposition import ExpositionError, Sample, parse_exposition


@dataclass(frozen=True, slots=True)
class Step:
    """One page read: the rates over the window up to it, and what the pod held then."""

    at: float
    requests: float | None  # requests per second arriving (None: no rate yet)
    tokens: float | None  # weighted tokens per second (None: no token counters, or no rate yet)
    in_flight: float
    waiting: float
    per_token: float | None = None  # mean seconds per output token over the window (None: not printed)


# The engines' per-output-token latency histograms, the first one on a page is read (its _sum and _count):
# vLLM's inter-token latency (0.10 on) and its older per-request mean, SGLang's in both spellings,
# trtllm-serve's, TGI's per-request mean time per token.
LATENCY_FAMILIES = (
    "vllm:inter_token_latency_seconds",
    "vllm:time_per_output_token_seconds",
    "sglang:inter_token_latency_seconds",
    "sglang_inter_token_latency_seconds",
    "sglang:time_per_output_token_seconds",
    "sglang_time_per_output_token_seconds",
    "trtllm_time_per_output_token_seconds",
    "tgi_request_mean_time_per_token_duration",
)
_LATENCY_NAMES = frozenset(f"{base}{end}" for base in LATENCY_FAMILIES for end in ("_sum", "_count"))
_PAGE_NAMES = POD_PAGE_NAMES | _LATENCY_NAMES


LatencyTotals = dict[tuple[str, ...], tuple[float, float]]
"""Per series of a latency histogram (its label values): (seconds, observations) so far."""


def latency_totals(samples: list[Sample], model: str | None = None) -> LatencyTotals | None:
    """(seconds, observations) per series of the first per-token latency histogram on a page, of `model`
    where one is given (a page serving two models times each apart)."""
    if model is not None:
        samples = [s for s in samples if model_of(s.labels) == model]
    for base in LATENCY_FAMILIES:
        sums = {_series(s): s.value for s in samples if s.name == f"{base}_sum"}
        counts = {_series(s): s.value for s in samples if s.name == f"{base}_count"}
        if sums and counts:
            return {key: (sums[key], counts[key]) for key in sums.keys() & counts.keys()}
    return None


def _series(sample: Sample) -> tuple[str, ...]:
    return tuple(sorted(f"{name}={value}" for name, value in sample.labels.items()))


def mean_per_token(totals: list[LatencyTotals]) -> float | None:
    """Mean seconds per observation between the first totals and the last, each series on its own (SPEC
    §6: one that drops counts from 0, one that appears counts from 0, one engine's restart is not the pod's)."""
    seconds = observations = 0.0
    for before, after in itertools.pairwise(totals):
        for key, (s1, c1) in after.items():
            s0, c0 = before.get(key, (0.0, 0.0))
            restarted = c1 < c0 or s1 < s0
            seconds += s1 if restarted else s1 - s0
            observations += c1 if restarted else c1 - c0
    if observations <= 0 or not math.isfinite(seconds / observations):
        return None
    return seconds / observations


# A `demand` trigger on the one calibrated pod: its value is that pod's own rate (any threshold: one pod
# reporting, none missing, is its own sum).
_ONE_POD_DEMAND = parse_trigger({"metric": "demand", "threshold": "1"})
_POD, _SOURCE = "calibrated", "calibrate"
_PODS, _VIEW = frozenset({_POD}), NamespaceView((), (_POD,), 1)  # its page, fresh


@dataclass(slots=True)
class Calibration:
    """Pages of one pod in, steps and the capacity out (pure: the caller reads pages and keeps time)."""

    window: float
    waiting_above: float = 0.0  # requests waiting above this count as "requests wait"
    sustain: int = 3  # pages in a row with requests waiting end the ramp
    engine: str = "auto"
    model: str | None = None
    prefill_weight: float = DEFAULT_PREFILL_WEIGHT
    per_token_target: float | None = None  # seconds per output token not to pass (None: waiting alone)
    best: Step | None = None  # the step with the highest rate while nothing waited in its window
    waited_in_a_row: int = 0
    # The pod's counters kept per series, as the server keeps them (SPEC §6: rates per series).
    history: DemandHistory = field(default_factory=lambda: DemandHistory(forget_after=math.inf))
    track: Track = field(default_factory=lambda: Track([]))  # the pod over the window, as last read
    _waiting: list[tuple[float, float]] = field(default_factory=list)
    _latency: list[tuple[float, LatencyTotals]] = field(default_factory=list)
    latency_seen: bool = False  # some page carried a per-token latency histogram (LATENCY_FAMILIES)

    def observe(self, at: float, page: bytes) -> Step | str:
        """Read one page; a Step, or why this page gives none."""
        try:
            samples = parse_exposition(page, _PAGE_NAMES)
        except ExpositionError as error:
            return f"not a metrics page: {error}"
        pod = PodSamples("", _POD, tuple(samples), _SOURCE)
        self.history.on_page(SourceKind.INFERENCE, Page.from_readings(_SOURCE, at, [pod]))
        track = self.history.read(pod, self.engine, self.model, self.window, at)
        if track.problem is not None:
            return f"{track.engine}: {track.problem.reason}"
        self.track = track
        waiting = _waiting_of(samples, self.engine, self.model)
        self._waiting.append((at, waiting))
        start = track.points[0].at
        self._waiting = [(t, w) for t, w in self._waiting if t >= start]
        totals = latency_totals(samples, self.model)
        if totals is not None:
            self.latency_seen = True
            self._latency.append((at, totals))
        self._latency = [(t, v) for t, v in self._latency if t >= start]
        per_token = mean_per_token([v for _, v in self._latency])
        requests = self._decided(DemandUnit.REQUESTS, at)
        in_flight = track.points[-1].in_flight
        step = Step(at, requests, self._decided(DemandUnit.TOKENS, at), in_flight, waiting, per_token)
        slow = self.per_token_target is not None and (per_token is None or per_token > self.per_token_target)
        over = waiting > self.waiting_above or (slow and per_token is not None)
        self.waited_in_a_row = self.waited_in_a_row + 1 if over else 0
        calm = all(w <= self.waiting_above for _, w in self._waiting) and not slow
        if (
            calm
            and step.requests is not None
            and (self.best is None or step.requests > (self.best.requests or 0))
        ):
            self.best = step
        return step

    def _decided(self, unit: DemandUnit, at: float) -> float | None:
        """The pod's demand in `unit` as the server decides it for a `demand` trigger on this one pod
        (so calibrate measures what the threshold is compared with); None while it has none."""
        spec = dataclasses.replace(
            _ONE_POD_DEMAND, window=self.window, demand_unit=unit, prefill_weight=self.prefill_weight
        )
        snapshot = Snapshot(
            "", at, SourceKind.INFERENCE, view=_VIEW, target_pods=_PODS, tracks=((_POD, self.track),)
        )
        evaluation = decide(spec, snapshot).evaluation
        return None if evaluation is None else evaluation.value

    @property
    def measured(self) -> bool:
        """A threshold can be suggested: the best step's rate is one a trigger takes (a rate of 0 is no
        load having reached the pod, not a capacity)."""
        best = self.best
        return best is not None and best.requests is not None and suggested(best.requests) >= MIN_THRESHOLD

    @property
    def saturated(self) -> bool:
        """Requests have waited (or the time per output token passed its target) on `sustain` pages in a
        row: the ramp is past what the pod serves."""
        return self.waited_in_a_row >= self.sustain


def _waiting_of(samples: list[Sample], engine: str, model: str | None) -> float:
    # The history read the same page whole: the waiting gauge is there (Triton's pending count too).
    reading = pod_reading(samples, engine, model)
    return 0.0 if isinstance(reading.waiting, Missing) else reading.waiting


def step_line(step: Step, started: float) -> str:
    tokens = f"{step.tokens:10.0f}" if step.tokens is not None else "         -"
    requests = f"{step.requests:8.2f}" if step.requests is not None else "       -"
    latency = f"  {step.per_token * 1000:6.1f} ms/token" if step.per_token is not None else ""
    return (
        f"{step.at - started:7.0f}s {requests} req/s {tokens} tok/s  in flight {step.in_flight:5.0f}"
        f"  waiting {step.waiting:4.0f}{latency}"
    )


def suggested(rate: float) -> float:
    """The threshold suggested for a measured rate: 90 % of it, for headroom."""
    return rate * 0.9


def summary(calibration: Calibration) -> str:
    best = calibration.best
    if calibration.per_token_target is not None and not calibration.latency_seen:
        # Without the histogram every step counts as too slow: say so, not "start the ramp lower".
        return (
            "--per-token-target needs a per-output-token latency histogram, and the page has none of"
            f" {', '.join(f'{name}_sum/_count' for name in LATENCY_FAMILIES[:2])} (or the other engines'"
            " families): drop --per-token-target to calibrate on waiting requests alone"
        )
    if best is None or best.requests is None:
        return "no rate was measured while nothing waited (and within the latency target): start the ramp lower, or give it longer"
    if not calibration.measured:
        # Nothing finished: a rate of 0 is no capacity, and threshold 0 is refused anyway.
        return (
            f"no load reached the pod: {best.requests:.3g} requests/s finished while nothing waited, and no"
            " threshold can be measured from that; point the load generator at this pod (its finished"
            " counter must move) and run calibrate during the ramp"
        )
    tokens = f" ({best.tokens:.0f} weighted tokens/s, demandUnit: tokens)" if best.tokens is not None else ""
    limit = "requests started waiting"
    if calibration.per_token_target is not None:
        limit += f" or the time per output token passed {calibration.per_token_target * 1000:g} ms"
    reached = (
        f"{limit} past it"
        if calibration.saturated
        else "requests never waited: the ramp did not reach this pod's capacity, so this is a lower bound"
    )
    within = " and within the latency target" if calibration.per_token_target is not None else ""
    return (
        f"highest arrival rate with nothing waiting{within}: {best.requests:.2f} requests/s{tokens}; {reached}.\n"
        f'threshold for metric: demand: a little below it, e.g. "{suggested(best.requests):.3g}" (90 %), lower'
        " for more latency headroom"
    )


async def run(
    url: str,
    calibration: Calibration,
    *,
    fetch: Callable[[str], Awaitable[bytes]],
    interval: float,
    duration: float,
    out: Callable[[str], None] = print,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> Calibration:
    """Read `url` every `interval` seconds until the pod saturates or `duration` has passed."""
    started = clock()
    out(
        f"reading {url} every {interval:g}s, rates over the last {calibration.window:g}s; run the load ramp now"
    )
    while clock() - started <= duration:
        try:
            body = await fetch(url)
        except FetchError as error:
            out(f"{clock() - started:7.0f}s page not read: {error}")
        else:
            step = calibration.observe(clock(), body)
            out(step_line(step, started) if isinstance(step, Step) else f"{clock() - started:7.0f}s {step}")
            if calibration.saturated:
                break
        if clock() - started + interval > duration:
            break  # the next read would come after --duration
        await sleep(interval)
    out(summary(calibration))
    return calibration


def check_choices(engine: str, model: str | None) -> str | None:
    """Why `--engine`/`--model` can never be measured (as a `demand` trigger refuses them), or None."""
    metadata = {"metric": "demand", "threshold": "1", "podNamePrefix": "calibrate-", "engine": engine}
    if model is not None:
        metadata["model"] = model
    try:
        parse_trigger(metadata)
    except ConfigError as error:
        said = str(error).removeprefix("metadata ")
        flag = "--model" if model is not None and said.startswith("model") else "--engine"
        return f"{flag}: {said}"
    return None
