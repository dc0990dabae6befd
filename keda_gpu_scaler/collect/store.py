"""The sample store: the last page of every exporter, normalised to GPU readings, each knowing its age."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from keda_gpu_scaler.core.snapshot import OWN_PAGE, NamespaceView, Reading, SourceKind
from keda_gpu_scaler.pages.vendors import GpuReading

# Without Kubernetes, the pods last seen on an exporter that is now failing or stale, or whose page lost
# its pod labels, still count as target pods (as missing ones) for as long as that lasts, so one dead
# exporter cannot shrink the value (SPEC §4).
ATTRIBUTION_LOST = (
    "its page has GPU series but no pod labels (dcgm-exporter lost the kubelet's pod-resources socket?)"
)
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Page:
    """One successful collection from one source, grouped by namespace for per-trigger look-ups."""

    source: str
    collected_at: float  # monotonic seconds
    by_namespace: dict[str, tuple[Reading, ...]]
    # The page had GPU series but none named a pod: either no pod uses a GPU there, or the exporter lost
    # track of pods. Which one cannot be told from the page; pods seen there before stay missing pods.
    unattributed: bool = False

    @classmethod
    def from_readings(
        cls, source: str, collected_at: float, readings: Iterable[Reading], *, gpu_series: bool = False
    ) -> Page:
        """gpu_series: the page had series of a known GPU family (attributed to a pod or not)."""
        grouped: defaultdict[str, list[Reading]] = defaultdict(list)
        for reading in readings:
            grouped[reading.namespace].append(reading)
        by_namespace = {ns: tuple(rs) for ns, rs in grouped.items()}
        return cls(source, collected_at, by_namespace, unattributed=gpu_series and not by_namespace)

    def readings_of(self, kind: type[R]) -> Iterator[R]:
        """The page's readings of one type, every namespace's."""
        for readings in self.by_namespace.values():
            yield from (reading for reading in readings if isinstance(reading, kind))


@dataclass(slots=True)
class SourceState:
    source: str
    kind: SourceKind = SourceKind.SCRAPE
    namespace: str | None = None  # None: the source may name pods of any namespace
    pod: str | None = None  # the one pod this source is about (an inference server's own page), if known
    last_page: Page | None = None
    last_error: str | None = None
    # The last page that named pods, kept while newer pages name none (see Page.unattributed).
    last_attributed: Page | None = None


class Store:
    """Holds each source's last good page and its failures; tells waiters when anything changes."""

    def __init__(self) -> None:
        self._sources: dict[str, SourceState] = {}
        # By kind and namespace (None: sources naming pods of any namespace), so one namespace's view
        # reads only its own sources, not thousands of other namespaces' pod pages.
        self._index: dict[tuple[SourceKind, str | None], dict[str, SourceState]] = {}
        # Per namespace, so a stream wakes only when its own namespace's data changed: with many streams,
        # waking all of them on every scrape of every exporter would cost an evaluation each.
        self._versions: defaultdict[str, int] = defaultdict(int)
        self._changed: dict[str, asyncio.Event] = {}
        self._waiters: defaultdict[str, int] = defaultdict(int)  # per namespace, how many wait on it
        self._closed = False
        # Told of every page recorded and of every source removed with its last page (kind, page): what
        # keeps a history of pages (`metric: demand`'s rates) follows the store without a copy of it.
        self.page_listeners: list[Callable[[SourceKind, Page], None]] = []
        self.removal_listeners: list[Callable[[SourceKind, Page], None]] = []

    def version(self, namespace: str) -> int:
        # Read without inserting: calls about namespaces with no data (any name a caller invents) add nothing.
        return self._versions.get(namespace, 0)

    def sources(self) -> list[SourceState]:
        return list(self._sources.values())

    def source(self, source: str) -> SourceState | None:
        """One source's state (read only: callers must not change it)."""
        return self._sources.get(source)

    def add_source(
        self,
        source: str,
        kind: SourceKind = SourceKind.SCRAPE,
        namespace: str | None = None,
        pod: str | None = None,
    ) -> None:
        if source not in self._sources:
            state = SourceState(source, kind, namespace, pod)
            self._sources[source] = state
            self._index.setdefault((kind, namespace), {})[source] = state

    def remove_source(self, source: str) -> None:
        state = self._sources.pop(source, None)
        if state is None:
            return
        group = self._index.get((state.kind, state.namespace), {})
        group.pop(source, None)
        if not group:
            self._index.pop((state.kind, state.namespace), None)
        if state.last_page is not None:
            self._bump(state.last_page.by_namespace)
            for listener in self.removal_listeners:
                listener(state.kind, state.last_page)

    def record_page(self, page: Page) -> None:
        self.add_source(page.source)
        state = self._sources[page.source]
        old = state.last_page
        recovered = old is None or state.last_error is not None
        state.last_page = page
        state.last_error = None
        for listener in self.page_listeners:
            listener(state.kind, page)
        if page.by_namespace:
            state.last_attributed = None
        elif page.unattributed and old is not None and old.by_namespace:
            state.last_attributed = old
        if recovered:
            self._bump(page.by_namespace.keys() | (old.by_namespace.keys() if old else set()))
            return
        assert old is not None
        # Exporters refresh slower than we scrape (dcgm-exporter: 30 s): an unchanged namespace wakes nobody.
        self._bump(
            ns
            for ns in page.by_namespace.keys() | old.by_namespace.keys()
            if page.by_namespace.get(ns) != old.by_namespace.get(ns)
        )

    def record_failure(self, source: str, error: str) -> None:
        self.add_source(source)
        state = self._sources[source]
        first = state.last_error is None
        state.last_error = error
        if first and state.last_page is not None:
            self._bump(state.last_page.by_namespace)

    def view(
        self, namespace: str, now: float, max_staleness: float, kind: SourceKind = SourceKind.SCRAPE
    ) -> NamespaceView:
        readings: list[Reading] = []
        recently_seen: dict[str, str] = {}
        seen_as: dict[str, set[Any]] = {}
        problems: list[str] = []
        pod_problems: dict[str, str] = {}
        fresh: list[str] = []
        # The sources naming pods of any namespace first, then the namespace's own, each in the order they
        # were added: their fresh pages' readings, and what the others leave (problems, pods).
        anywhere = self._index.get((kind, None), {})
        own = self._index.get((kind, namespace), {})
        for state in (*anywhere.values(), *own.values()):
            if (page := _fresh_page(state, now, max_staleness)) is not None:
                fresh.append(state.source)
                readings.extend(page.by_namespace.get(namespace, ()))
            if _is_special(state, now, max_staleness):
                self._special(
                    state, namespace, now, max_staleness, recently_seen, seen_as, problems, pod_problems
                )
        return NamespaceView(
            tuple(readings),
            tuple(fresh),
            len(anywhere) + len(own),
            recently_seen,
            tuple(problems),
            pod_problems,
            {pod: frozenset(kinds) for pod, kinds in seen_as.items()},
        )

    @staticmethod
    def _special(
        state: SourceState,
        namespace: str,
        now: float,
        max_staleness: float,
        recently_seen: dict[str, str],
        seen_as: dict[str, set[Any]],
        problems: list[str],
        pod_problems: dict[str, str],
    ) -> None:
        """What a source that is not fresh, or fresh but showing no pods, says about a namespace: its pods
        recently seen, why, and what they were read as (GPU families; OWN_PAGE for a pod's own page)."""

        def seen(reading: Reading, why: str) -> None:
            recently_seen.setdefault(reading.pod, why)
            kind = reading.family if isinstance(reading, GpuReading) else OWN_PAGE
            seen_as.setdefault(reading.pod, set()).add(kind)

        if _fresh_page(state, now, max_staleness) is not None:
            assert state.last_attributed is not None
            reason = f"{state.source}: {ATTRIBUTION_LOST}"
            for reading in state.last_attributed.by_namespace.get(namespace, ()):
                seen(reading, reason)
            return
        reason = source_problem(state, now, max_staleness)
        # However long the outage lasts: forgetting these pods would shrink the value (made-up load drop).
        if state.pod is not None:
            recently_seen.setdefault(state.pod, reason)
            seen_as.setdefault(state.pod, set()).add(OWN_PAGE)
            pod_problems.setdefault(state.pod, reason)
        else:
            problems.append(reason)
        for last in (state.last_page, state.last_attributed):
            if last is not None:
                for reading in last.by_namespace.get(namespace, ()):
                    seen(reading, reason)

    async def wait_for_change(self, namespace: str, seen_version: int, timeout: float) -> None:
        """Return once the namespace's data moved past seen_version, or after timeout (data also ages)."""
        if self._closed or self._versions.get(namespace, 0) != seen_version:
            return
        event = self._changed.setdefault(namespace, asyncio.Event())
        self._waiters[namespace] += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout)
        finally:
            # The last waiter of a namespace takes its event along: a namespace whose data never changes
            # (no pods yet, a typo) kept one for good after its stream ended.
            self._waiters[namespace] -= 1
            if not self._waiters[namespace]:
                del self._waiters[namespace]
                if self._changed.get(namespace) is event:
                    del self._changed[namespace]

    def wake(self, namespace: str) -> None:
        """Wake the namespace's waiters now, its data unchanged (a stream that must end at once)."""
        event = self._changed.pop(namespace, None)
        if event is not None:
            event.set()

    def close(self) -> None:
        """Wake every waiter now and from now on (shutdown: streams must end at once)."""
        self._closed = True
        self._bump(list(self._changed))

    def _bump(self, namespaces: Iterable[str]) -> None:
        for namespace in namespaces:
            self._versions[namespace] += 1
            # Waiters that arrive after this change block until the next one, not this one.
            event = self._changed.pop(namespace, None)
            if event is not None:
                event.set()


def source_problem(state: SourceState, now: float, max_staleness: float) -> str:
    """Why a source that is not fresh gives no data now: its failure, or its last page's age."""
    page = state.last_page
    if page is None:
        return f"{state.source}: {state.last_error or 'no data yet'}"
    age = now - page.collected_at
    if state.last_error:
        return f"{state.source}: {state.last_error}; last data {age:.1f}s old"
    return f"{state.source}: last data {age:.1f}s old (max staleness {max_staleness:g}s)"


def _fresh_page(state: SourceState, now: float, max_staleness: float) -> Page | None:
    """The source's last page if it is fresh (at most max_staleness old), else None."""
    page = state.last_page
    return page if page is not None and now - page.collected_at <= max_staleness else None


def _is_special(state: SourceState, now: float, max_staleness: float) -> bool:
    """Not fresh, or fresh but still showing the pods of an earlier page (see Store._special)."""
    return _fresh_page(state, now, max_staleness) is None or state.last_attributed is not None
