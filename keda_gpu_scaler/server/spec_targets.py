"""The targets one ScaledObject's triggers answer in GetMetricSpec and send on StreamMetricSpec."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable

from keda_gpu_scaler.core.trigger import TriggerSpec

# Each spec KEDA receives on StreamMetricSpec makes it reconcile the ScaledObject and rewrite its HPA:
# targets that move at run time reach KEDA at most this often per ScaledObject.
SPEC_UPDATE_INTERVAL = 60.0


class CurrentTargets:
    """Each trigger's current target: its metadata's threshold until set() moves it.

    set() is the seam for targets learned at run time (`threshold: auto`). Moves are published together,
    at most once per SPEC_UPDATE_INTERVAL; GetMetricSpec and the open spec streams read only what is
    published, so GetMetricSpec always answers what the streams send (KEDA's rule for the two).
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._published: dict[TriggerSpec, float] = {}
        self._proposed: dict[TriggerSpec, float] = {}
        self._published_at = -math.inf
        self._changed: asyncio.Event | None = None  # made by the first waiter: most ScaledObjects have none
        self.version = 0

    def target(self, spec: TriggerSpec) -> float:
        self._publish_if_due()
        return self._current(spec)

    def set(self, spec: TriggerSpec, value: float) -> None:
        """Move a trigger's target; it reaches GetMetricSpec and the streams at the next allowed moment."""
        self._proposed[spec] = value
        self._publish_if_due()

    def forget(self, spec: TriggerSpec) -> None:
        """A trigger no longer followed: its target goes with it."""
        self._published.pop(spec, None)
        self._proposed.pop(spec, None)

    def due_in(self) -> float:
        """Seconds until the moves not yet published may be (infinite when there are none)."""
        if not self._proposed:
            return math.inf
        return max(self._published_at + SPEC_UPDATE_INTERVAL - self._clock(), 0.0)

    async def wait_for_change(self, seen_version: int, timeout: float) -> None:
        """Return once a move is published after seen_version, on wake(), or after timeout."""
        if self.version != seen_version:
            return
        if self._changed is None:
            self._changed = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), min(timeout, self.due_in()))
        self._publish_if_due()

    def wake(self) -> None:
        """Wake every waiter now (shutdown: the streams must end at once)."""
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    def _publish_if_due(self) -> None:
        if self.due_in() > 0:
            return
        moved = {spec: value for spec, value in self._proposed.items() if value != self._current(spec)}
        self._proposed.clear()
        if not moved:
            return
        self._published.update(moved)
        self._published_at = self._clock()
        self.version += 1
        self.wake()

    def _current(self, spec: TriggerSpec) -> float:
        return self._published.get(spec, spec.threshold)
