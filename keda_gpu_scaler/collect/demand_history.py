"""The pages `metric: demand` takes rates over: per wanted pod, its DemandPoints of the last window.

A rate needs each pod's page at two instants, and the store keeps only the last one. This module listens
to the store (Store.page_listeners / removal_listeners) and keeps, for each (pod, engine choice, model) a
followed `demand` trigger asked about, the points of the last `window` seconds, worked out as each page
arrives. It stays bounded: only pods a trigger wants (each evaluation says which), only the last window's
points (capped), and a pod's points go with its page source, or once no trigger has asked for them for
`forget_after` seconds. The newest page of every inference pod is remembered by reference (the store holds
the same objects) so that a pod asked about for the first time starts with one point, not none.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from keda_gpu_scaler.collect.store import Page, SourceKind
from keda_gpu_scaler.demand import DemandPoint, over_window
from keda_gpu_scaler.engines import Missing, PodSamples, in_flight, pod_counters

TrackKey = tuple[str, str | None]
"""(engine choice, model): what a page is read as."""
PodKey = tuple[str, str]
"""(namespace, pod)."""

# At most this many points per track whatever the window (600 s at a 1 s scrape interval): a bound on
# memory that no configuration can lift.
MAX_POINTS = 1024
# How often tracks nobody asks for any more are looked for (seconds of page time).
SWEEP_EVERY = 30.0
_INFERENCE_KINDS = frozenset({SourceKind.INFERENCE})


@dataclass(slots=True)
class Track:
    """One pod read one way: its usable points, oldest first, and why its newest page has none."""

    window: float
    wanted_at: float
    points: list[DemandPoint] = field(default_factory=list)
    # The newest page's reading where it gives no point (a NaN counter, a family gone): the pod is
    # missing until a page gives one again, whatever older points say.
    problem: Missing | None = None
    last_at: float = float("-inf")
    engine: str = "unknown"  # what the newest page was read as (for /explain)


def demand_point(page: PodSamples, key: TrackKey, at: float) -> tuple[str, DemandPoint | Missing]:
    """What a pod page was read as, and its point for `metric: demand` or why it has none (never a
    made-up 0)."""
    reading, counters = pod_counters(page.samples, key[0], key[1])
    engine = reading.engine.value if reading.engine is not None else "unknown"
    flight = in_flight(reading)
    if isinstance(flight, Missing):
        return engine, flight
    if isinstance(counters.finished, Missing):
        return engine, counters.finished
    prompt = None if isinstance(counters.prompt_tokens, Missing) else counters.prompt_tokens
    generated = None if isinstance(counters.generation_tokens, Missing) else counters.generation_tokens
    return engine, DemandPoint(at, counters.finished, flight, prompt, generated)


class DemandHistory:
    """Per wanted pod and reading, the points of its last window (see the module docstring)."""

    def __init__(self, *, forget_after: float) -> None:
        self._forget_after = forget_after
        self._tracks: dict[PodKey, dict[TrackKey, Track]] = {}
        self._newest: dict[PodKey, tuple[float, PodSamples]] = {}
        self._swept_at = float("-inf")

    def __len__(self) -> int:
        """How many tracks are kept (for tests and the bound)."""
        return sum(len(tracks) for tracks in self._tracks.values())

    def points(self, namespace: str, pod: str, key: TrackKey, window: float, now: float) -> Track:
        """The pod's track read as `key`, kept from now on (an evaluation asks for every target pod)."""
        tracks = self._tracks.setdefault((namespace, pod), {})
        track = tracks.get(key)
        if track is None:
            track = tracks[key] = Track(window, now)
            newest = self._newest.get((namespace, pod))
            if newest is not None:
                self._add(track, key, *newest)
        else:
            track.wanted_at = now
            track.window = max(track.window, window)
        return track

    def on_page(self, kind: SourceKind, page: Page) -> None:
        """Store listener: a page was recorded."""
        if kind not in _INFERENCE_KINDS:
            return
        for namespace, readings in page.by_namespace.items():
            for reading in readings:
                if not isinstance(reading, PodSamples):
                    continue
                pod = (namespace, reading.pod)
                self._newest[pod] = (page.collected_at, reading)
                for key, track in self._tracks.get(pod, {}).items():
                    self._add(track, key, page.collected_at, reading)
        if page.collected_at - self._swept_at >= SWEEP_EVERY:
            self._sweep(page.collected_at)

    def on_removed(self, kind: SourceKind, page: Page) -> None:
        """Store listener: a page source is gone (its pod left the targets): its pods' points go too."""
        if kind not in _INFERENCE_KINDS:
            return
        for namespace, readings in page.by_namespace.items():
            for reading in readings:
                self._tracks.pop((namespace, reading.pod), None)
                self._newest.pop((namespace, reading.pod), None)

    def _add(self, track: Track, key: TrackKey, at: float, samples: PodSamples) -> None:
        if at <= track.last_at:
            return  # the same page again
        track.last_at = at
        track.engine, point = demand_point(samples, key, at)
        if isinstance(point, Missing):
            track.problem = point
            return
        track.problem = None
        points = track.points
        points.append(point)
        keep = over_window(points, track.window)
        if len(keep) < len(points) or len(points) > MAX_POINTS:
            track.points = list(keep)[-MAX_POINTS:]

    def _sweep(self, now: float) -> None:
        self._swept_at = now
        for pod in list(self._tracks):
            tracks = self._tracks[pod]
            for key in [k for k, t in tracks.items() if now - t.wanted_at > self._forget_after]:
                del tracks[key]
            if not tracks:
                del self._tracks[pod]
