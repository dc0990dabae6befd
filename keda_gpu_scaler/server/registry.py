"""One owner for every followed ScaledObject: its triggers' subscriptions (what they want collected,
their last answers, explanations, metric label sets), discovery tracking and logged notes — all
forgotten together after the TTL."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from keda_gpu_scaler.core.decide import SloReading
from keda_gpu_scaler.core.errors import ConfigError, TooManyScaledObjects, quoted
from keda_gpu_scaler.core.learned_target import LearnedTarget, Learner
from keda_gpu_scaler.core.names import NAMESPACE_RULE, OBJECT_NAME_RULE, is_namespace, is_object_name
from keda_gpu_scaler.core.scaling import Evaluation
from keda_gpu_scaler.core.trigger import TriggerSpec
from keda_gpu_scaler.server.spec_targets import CurrentTargets

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Explanation:
    """The inputs and result of one evaluation, kept as objects: /explain builds JSON only when asked."""

    spec: TriggerSpec
    evaluated_at: float  # wall-clock seconds (for people), not the monotonic clock
    evaluation: Evaluation | None
    error: str | None
    notes: tuple[str, ...] = ()
    targets: Any = None  # what Kubernetes discovery answered (Targets), None without Kubernetes
    slo: SloReading | None = None  # `demand` with a latency target: its reads and headroom
    learned: LearnedTarget | None = None  # `threshold: auto`: the target and why

    @property
    def discovery(self) -> dict[str, Any] | None:
        """What Kubernetes discovery said, for /explain: made when asked, not on every evaluation."""
        if self.targets is None:
            return None
        return {"targetPods": sorted(self.targets.pods), "metricType": self.targets.metric_type}


# The recent demand sums a trigger with an SLO keeps for its headroom (evaluator.HEADROOM_SPAN).
DEMAND_SUMS_KEPT = 32


@dataclass(slots=True)
class Subscription:
    """One followed trigger: its spec, its last answers, and what was taken from them.

    A ScaledObject may have several external triggers; KEDA calls about each with its own metadata, so
    each distinct spec is one subscription. A trigger edited in the ScaledObject arrives as a new spec;
    the old one's subscription is dropped whole (see Registry), never left holding pages or series.
    """

    spec: TriggerSpec
    last_call: float
    explanation: Explanation | None = None
    # The /metrics label set of its value and activity gauges, once it has published them.
    metric_labels: tuple[str, str, str] | None = None
    # With Kubernetes: the discovery answer its wanted sources (pod pages, exporter nodes) were taken from.
    sources_from: Any = None
    # `demand` with a latency target: (time, the fresh pods' summed demand) of recent decisions.
    demand_sums: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=DEMAND_SUMS_KEPT))
    # `demand` with a latency target: (time, requests, requests over a target) of recent windows.
    latency_windows: deque[tuple[float, float, float]] = field(default_factory=lambda: deque(maxlen=256))
    # `threshold: auto`: its learner, when it started, when it last took samples, and its last answer.
    learner: Learner | None = None
    learning_since: float = 0.0
    sampled_at: float = float("-inf")
    learned: LearnedTarget | None = None


# Subscriptions kept per ScaledObject: more external triggers than this on one object is not a real
# setup, and a caller sending ever new metadata must not grow the state or /metrics without bound.
MAX_TRIGGERS_PER_SCALEDOBJECT = 16


# Notes one followed ScaledObject remembers (so each is logged once) and logs: a few real notes (a typo,
# a contradiction) are far fewer; a caller sending new metadata on every call must not grow memory or the
# log without bound (60,000 calls once made 21 MB of log).
MAX_NOTES_REMEMBERED = 64
MAX_NOTES_LOGGED = 32


@dataclass(slots=True)
class Followed:
    """Everything the scaler keeps about one ScaledObject."""

    namespace: str
    name: str
    last_call: float
    # What GetMetricSpec answers and StreamMetricSpec sends for each of its triggers.
    targets: CurrentTargets
    # One per trigger spec KEDA calls about, least recently called first.
    triggers: OrderedDict[TriggerSpec, Subscription] = field(default_factory=OrderedDict)
    # The notes logged so far (most recent last, at most MAX_NOTES_REMEMBERED) and how many were new.
    notes_logged: OrderedDict[str, None] = field(default_factory=OrderedDict)
    notes_new: int = 0
    # StreamMetricSpec streams open for it now, per trigger: KEDA opens one per `external-push` trigger,
    # carrying that trigger's specs only, so another trigger's stream pushes nothing of this one's.
    spec_streams: Counter[TriggerSpec] = field(default_factory=Counter)
    # StreamIsActive streams open for it now, per trigger.
    activity_streams: Counter[TriggerSpec] = field(default_factory=Counter)

    def streamed(self, spec: TriggerSpec | None = None) -> bool:
        """Whether a stream (of `spec`, or of any trigger) is open for it: KEDA is following it, however
        long since its last unary call (a stream follows again only at its recheck)."""
        if spec is None:
            return bool(self.spec_streams) or bool(self.activity_streams)
        return self.spec_streams[spec] > 0 or self.activity_streams[spec] > 0

    @property
    def explanation(self) -> Explanation | None:
        """The most recent explanation among its triggers."""
        explained = [s.explanation for s in self.triggers.values() if s.explanation is not None]
        return max(explained, key=lambda e: e.evaluated_at, default=None)

    def explanations(self) -> list[Explanation]:
        """The last explanation of each of its triggers, in the order of their metric names. Triggers that
        share a metric name follow their whole spec, so /explain's `trigger=INDEX` names the same trigger
        however recently KEDA called about each."""
        explained = [s.explanation for s in self.triggers.values() if s.explanation is not None]
        return sorted(explained, key=lambda e: (e.spec.metric_name, e.spec.metric.value, repr(e.spec)))

    def log_once(self, note: str, level: int = logging.WARNING) -> bool:
        """Log a note about this ScaledObject the first time it is seen; True when it was new.

        Bounded whatever the caller sends (a new podNamePrefix on every call makes a new note each time):
        the notes remembered are the most recent MAX_NOTES_REMEMBERED, and at most MAX_NOTES_LOGGED new
        ones are logged while the ScaledObject is followed; the rest are in /explain only."""
        if note in self.notes_logged:
            self.notes_logged.move_to_end(note)
            return False
        self.notes_logged[note] = None
        if len(self.notes_logged) > MAX_NOTES_REMEMBERED:
            self.notes_logged.popitem(last=False)
        self.notes_new += 1
        if self.notes_new <= MAX_NOTES_LOGGED:
            log.log(level, "ScaledObject %s/%s: %s", self.namespace, self.name, note)
        elif self.notes_new == MAX_NOTES_LOGGED + 1:
            log.warning(
                "ScaledObject %s/%s: %d different notes logged; further ones are not logged while it is"
                " followed (see /explain): %s",
                self.namespace,
                self.name,
                MAX_NOTES_LOGGED,
                note,
            )
        else:
            log.debug("ScaledObject %s/%s: %s", self.namespace, self.name, note)
        return True


# Beyond the cap, a ScaledObject not called for this long makes room for a new one (see _make_room).
ROOM_AFTER_SECONDS = 60.0


class Tracker(Protocol):
    """Discovery's side of a ScaledObject's life: start following it, and forget it."""

    def track(self, namespace: str, name: str) -> None: ...

    def forget(self, namespace: str, name: str) -> None: ...

    def is_current(self, namespace: str, name: str, spec: TriggerSpec) -> bool | None:
        """Whether spec is one of the ScaledObject's triggers as last read (None: not known)."""


class Registry:
    """Followed ScaledObjects by (namespace, name), oldest call first, with one TTL and a cap that each
    namespace has a fair share of (see _make_room).

    Every call goes through follow(): it validates the reference, enforces the cap, keeps the entry
    alive, tells discovery, and subscribes a trigger seen for the first time (on_subscribe: it starts
    wanting what it reads). Entries not called for `ttl` seconds are evicted with all their state
    (on_drop for each trigger), on the next call and by a background sweep.
    """

    def __init__(
        self,
        *,
        ttl: float,
        cap: int,
        clock: Callable[[], float],
        tracker: Tracker | None = None,
        on_forget: Callable[[Followed], None] = lambda followed: None,
        on_drop: Callable[[Followed, Subscription], None] = lambda followed, subscription: None,
        on_subscribe: Callable[[Followed, Subscription], None] = lambda followed, subscription: None,
    ) -> None:
        self._ttl = ttl
        self._cap = cap
        self._clock = clock
        self._tracker = tracker
        self._on_forget = on_forget
        self._on_drop = on_drop
        self._on_subscribe = on_subscribe
        self._entries: OrderedDict[tuple[str, str], Followed] = OrderedDict()
        # The names followed in each namespace, least recently called first: its count and its share.
        self._by_namespace: dict[str, OrderedDict[str, None]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def follow(self, namespace: str, name: str, spec: TriggerSpec) -> Followed:
        key = (namespace, name)
        now = self._clock()
        entry = self._entries.get(key)
        if entry is None:
            check_reference(namespace, name)
            self.evict_expired(now)
            if len(self._entries) >= self._cap:
                self._make_room(namespace, now)
            entry = self._entries[key] = Followed(namespace, name, now, CurrentTargets(self._clock))
            self._by_namespace.setdefault(namespace, OrderedDict())[name] = None
        else:
            self._entries.move_to_end(key)
            self._by_namespace[namespace].move_to_end(name)
            entry.last_call = now
        if self._tracker is not None:
            self._tracker.track(namespace, name)
        subscription = entry.triggers.get(spec)
        if subscription is None:
            subscription = entry.triggers[spec] = Subscription(spec, now)
            self._prune(entry, now)
            if spec in entry.triggers:
                self._on_subscribe(entry, subscription)
        else:
            entry.triggers.move_to_end(spec)
            subscription.last_call = now
        return entry

    def _prune(self, entry: Followed, now: float) -> None:
        """Drop the subscriptions of triggers that are no longer the ScaledObject's.

        Beyond MAX_TRIGGERS_PER_SCALEDOBJECT the least recently called goes. With Kubernetes, a spec that
        matches none of the ScaledObject's triggers as last read goes once it has not been called for
        ROOM_AFTER_SECONDS while another, current one has been called since (an edited trigger: KEDA calls
        only the new metadata). Without Kubernetes the interest TTL ends an idle one (sweep).
        """
        while len(entry.triggers) > MAX_TRIGGERS_PER_SCALEDOBJECT:
            self._drop(entry, next(iter(entry.triggers)))
        if self._tracker is None:
            return
        current = {
            spec: self._tracker.is_current(entry.namespace, entry.name, spec) for spec in entry.triggers
        }
        latest_current = max(
            (entry.triggers[spec].last_call for spec, is_current in current.items() if is_current),
            default=None,
        )
        if latest_current is None:
            return
        for spec, is_current in current.items():
            subscription = entry.triggers[spec]
            if (
                is_current is False
                and now - subscription.last_call >= ROOM_AFTER_SECONDS
                and latest_current > subscription.last_call
            ):
                self._drop(entry, spec)

    def _drop(self, entry: Followed, spec: TriggerSpec) -> None:
        subscription = entry.triggers.pop(spec)
        entry.targets.forget(spec)
        self._on_drop(entry, subscription)

    def prune(self, now: float | None = None) -> None:
        """Drop stale subscriptions of every followed ScaledObject (the sweep's second half)."""
        now = self._clock() if now is None else now
        for entry in list(self._entries.values()):
            for spec, subscription in list(entry.triggers.items()):
                if now - subscription.last_call >= self._ttl and not entry.streamed(spec):
                    self._drop(entry, spec)
            self._prune(entry, now)

    def wake_spec_streams(self) -> None:
        """Wake every StreamMetricSpec waiting on a target (shutdown)."""
        for entry in self._entries.values():
            entry.targets.wake()

    def get(self, namespace: str, name: str) -> Followed | None:
        return self._entries.get((namespace, name))

    def in_namespace(self, namespace: str) -> list[Followed]:
        return [self._entries[(namespace, name)] for name in self._by_namespace.get(namespace, ())]

    def followed_keys(self) -> list[tuple[str, str]]:
        return sorted(self._entries)

    def evict_expired(self, now: float | None = None) -> int:
        """Forget every ScaledObject not called for the TTL; returns how many were forgotten."""
        now = self._clock() if now is None else now
        evicted = 0
        while self._evict_idle(now, self._ttl):
            evicted += 1
        return evicted

    def _evict_idle(
        self, now: float, idle: float, may_go: Callable[[Followed], bool] = lambda _: True
    ) -> bool:
        """Forget the least recently called ScaledObject not called for `idle` seconds that `may_go`; one
        with a stream open is not idle."""
        for entry in self._entries.values():  # least recently called first
            if now - entry.last_call < idle:
                return False
            if may_go(entry) and not entry.streamed():
                self._remove(entry)
                return True
        return False

    def _remove(self, entry: Followed) -> None:
        del self._entries[(entry.namespace, entry.name)]
        names = self._by_namespace[entry.namespace]
        del names[entry.name]
        if not names:
            del self._by_namespace[entry.namespace]
        self._forget(entry)

    def _make_room(self, namespace: str, now: float) -> None:
        """At the cap, make room for a new ScaledObject of `namespace`, or TooManyScaledObjects.

        First the least recently called ScaledObject gives way if KEDA has stopped calling it: KEDA calls
        every ScaledObject at least once per pollingInterval (30 s by default) and the HPA more often, so
        one not called for ROOM_AFTER_SECONDS is gone or was never KEDA's (a caller flooding the scaler
        with made-up names delays a real new ScaledObject by a minute at most, not a TTL) — but only the
        newcomer's namespace's own or one of a namespace above its share. Otherwise a
        namespace holding less than its fair share takes room from the namespace holding the most (then
        above its share), whose least recently called ScaledObject goes: one namespace polling thousands
        cannot lock the others out. A namespace at or above its share is refused.
        """
        room_after = min(ROOM_AFTER_SECONDS, self._ttl)
        # The cap divided evenly among the namespaces followed, the newcomer's counted. (A namespace below
        # it implies one above it: the counts add up to the cap.)
        namespaces = len(self._by_namespace) + (namespace not in self._by_namespace)
        share = self._cap // namespaces
        held = len(self._by_namespace.get(namespace, ()))
        # An idle one of the newcomer's own namespace or of one above its share: a ScaledObject at zero is
        # called only every pollingInterval, which may exceed a minute, and a namespace within its share
        # keeps it (SPEC §2).
        if self._evict_idle(
            now,
            room_after,
            lambda e: e.namespace == namespace or len(self._by_namespace[e.namespace]) > share,
        ):
            return
        if held < share:
            largest = max(self._by_namespace, key=lambda other: len(self._by_namespace[other]))
            self._remove(self._entries[(largest, next(iter(self._by_namespace[largest])))])
            return
        raise TooManyScaledObjects(
            f"namespace {namespace} follows {held} ScaledObjects, at or above its fair share of {share}"
            f" (the --max-scaledobjects limit of {self._cap} shared by {namespaces} namespaces); room is"
            f" made when a ScaledObject has not been called for {room_after:g}s"
        )

    def _forget(self, entry: Followed) -> None:
        if self._tracker is not None:
            self._tracker.forget(entry.namespace, entry.name)
        for spec in list(entry.triggers):
            self._drop(entry, spec)
        self._on_forget(entry)
        # A spec stream waiting on this entry follows the ScaledObject again at once, so it sends what
        # GetMetricSpec answers from now on (and ends at shutdown: wake_spec_streams no longer sees it).
        entry.targets.wake()

    async def sweep(self) -> None:
        """Evict in the background too, so state goes away even when no new call arrives."""
        while True:
            await asyncio.sleep(max(min(self._ttl / 10, 30.0), 0.05))
            self.evict_expired()
            self.prune()


def check_reference(namespace: str, name: str) -> None:
    """A ScaledObject reference must name a possible Kubernetes object (no state is kept for anything else)."""
    if not is_namespace(namespace):
        raise ConfigError(
            f"namespace {quoted(namespace)} is not a Kubernetes namespace name; allowed: {NAMESPACE_RULE}"
        )
    if not is_object_name(name):
        raise ConfigError(
            f"ScaledObject name {quoted(name)} is not a Kubernetes object name; allowed: {OBJECT_NAME_RULE}"
        )
