"""What discovery knows of one followed ScaledObject, and of each namespace it watches: the object as read,
its target's selector, what its triggers select, and why their pods are not known yet (NoData)."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from keda_gpu_scaler.core.errors import NoData
from keda_gpu_scaler.core.selectors import Selector, pod_selector_metadata
from keda_gpu_scaler.core.trigger import TriggerSpec
from keda_gpu_scaler.kubernetes.informer import ObjectInformer, PodInformer
from keda_gpu_scaler.kubernetes.scaledobject import (
    EXTERNAL_TRIGGER_TYPES,
    ScaledObjectInfo,
    ScaleTarget,
    metric_type_for,
)
from keda_gpu_scaler.kubernetes.targets import NamespaceIndex, Selection

# Under discovery's own name: its log lines read as they did before this part had a module of its own.
log = logging.getLogger("keda_gpu_scaler.kubernetes.resolver")

# Distinct trigger metadata whose metricType is remembered per ScaledObject: a caller that sends ever new
# ones must not grow discovery's state without bound (all are dropped, and worked out again if asked).
MAX_METRIC_TYPES = 32


@dataclass(eq=False)
class Followed:
    """What discovery knows of one ScaledObject."""

    namespace: str
    name: str
    info: ScaledObjectInfo | None = None
    object_error: str | None = None
    selector: Selector | None = None  # the scale target's, from its /scale subresource
    selector_of: ScaleTarget | None = None  # the scale target that selector was read from
    # The scale target's spec.replicas from its last /scale read, and when that read began (monotonic).
    replicas: int | None = None
    replicas_read_at: float = -math.inf
    scale_error: str | None = None
    # What its followed triggers select: the scale target's pods (wants_target), or other pods by their
    # podSelector metadata. Set by their subscriptions (select()); nothing selected, no pod watched.
    wants_target: bool = False
    overrides: dict[str, Selector] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None
    notes_logged: set[str] = field(default_factory=set)
    blip: str | None = None  # the re-read failing while the last one read stays in use
    # The last /scale re-read failed (its selector stays in use): the target's replicas are not known now.
    scale_unread: str | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # the ScaledObject changed: read /scale now
    # True once the ScaledObject was read and has an external trigger: only then are its namespace's
    # ScaledObjects watched, and its pods when a trigger selects some (a caller naming objects that do
    # not exist makes no watch).
    holds_namespace: bool = False
    selections: dict[Selector, Selection] = field(default_factory=dict)  # registered in the namespace
    metric_types: dict[TriggerSpec, tuple[str | None, str | None]] = field(default_factory=dict)
    covered: dict[Selector, tuple[int, int]] = field(default_factory=dict)  # exporter check passed at

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def selectors(self) -> set[Selector]:
        target = self.selector if self.wants_target else None
        return {s for s in (target, *self.overrides.values()) if s is not None}

    def select(self, specs: Iterable[TriggerSpec]) -> bool:
        """Take what these triggers select (the target's pods, or their podSelector's); True if it changed."""
        wants_target = False
        overrides: dict[str, Selector] = {}
        for spec in specs:
            if spec.pod_selector is None:
                wants_target = True
            else:
                overrides[spec.pod_selector] = self.overrides.get(spec.pod_selector) or pod_selector_metadata(
                    spec.pod_selector
                )
        if wants_target == self.wants_target and overrides.keys() == self.overrides.keys():
            return False
        self.wants_target = wants_target
        self.overrides = overrides
        return True

    def selector_for(self, spec: TriggerSpec) -> Selector:
        """The selector of the trigger's pods; raises NoData while it is not known."""
        if self.object_error is not None:
            raise NoData(self.object_error)
        if self.info is None:
            raise NoData(f"reading ScaledObject {self.ref} from the Kubernetes API (first look-up)")
        if not self.info.triggers:
            raise NoData(
                f"ScaledObject {self.ref} has no trigger of type {' or '.join(sorted(EXTERNAL_TRIGGER_TYPES))}"
            )
        if spec.pod_selector is not None:
            found = self.overrides.get(spec.pod_selector)
            if found is None:
                raise NoData(f"starting to follow the pods of podSelector {spec.pod_selector!r}")
            return found
        if self.scale_error is not None:
            raise NoData(self.scale_error)
        if self.selector is None:
            raise NoData(f"reading the pod selector of {self.info.target} (first look-up)")
        return self.selector

    def read_replicas(self, scale: Mapping[str, Any], began: float) -> None:
        """Keep spec.replicas of the target's /scale, read by a request that began at `began`."""
        replicas = (scale.get("spec") or {}).get("replicas")
        self.replicas = replicas if isinstance(replicas, int) and not isinstance(replicas, bool) else None
        self.replicas_read_at = began
        self.scale_unread = None

    def read_selector(self, selector: Selector, target: ScaleTarget) -> bool:
        """Keep the pod selector read from `target`'s /scale; True when it changed (registered anew)."""
        self.selector_of = target
        if selector == self.selector:
            return False
        self.selector = selector
        return True

    def scale_blip(self, note: str) -> None:
        """A /scale re-read failed while its last selector stays in use: its replicas are not known now."""
        self.note(note)
        self.scale_unread = note

    def replicas_since(self, emptied_at: float) -> int | None:
        """The target's replicas from a /scale read that began after its pods last went; None: no such
        read yet (the replicas counted may have gone with them, as at a scale to zero). NoData while its
        /scale cannot be read: with no pod, at zero cannot be told from pods that cannot start (SPEC §4)."""
        if self.replicas_read_at > emptied_at:
            return self.replicas
        if self.scale_unread is not None:
            raise NoData(f"the scale target has no pod and {self.scale_unread}")
        return None

    def another_target(self) -> None:
        """The ScaledObject names another scale target: what the old one's /scale said goes with it."""
        self.selector = self.selector_of = None
        self.replicas, self.replicas_read_at, self.scale_unread = None, -math.inf, None

    def metric_type(self, spec: TriggerSpec) -> str | None:
        """The trigger's metricType as the ScaledObject says (remembered per trigger); a doubt is logged once."""
        found = self.metric_types.get(spec)
        if found is None:
            assert self.info is not None
            found = metric_type_for(self.info, spec)
            if len(self.metric_types) >= MAX_METRIC_TYPES:
                self.metric_types.clear()
            self.metric_types[spec] = found
        metric_type, note = found
        if note is not None and note not in self.notes_logged:
            self.notes_logged.add(note)
            log.warning(
                "ScaledObject %s: cannot tell the trigger's metricType (%s); aggregation defaults to sum,"
                " right for metricType AverageValue",
                self.ref,
                note,
            )
        return metric_type

    def note(self, note: str | None) -> None:
        """Log a passing problem of the background re-read when it starts or changes, and its end."""
        if note == self.blip:
            return
        if note is not None:
            log.warning("%s", note)
        else:
            log.info("ScaledObject %s: reading it from the Kubernetes API works again", self.ref)
        self.blip = note


@dataclass(eq=False)
class WatchedNamespace:
    index: NamespaceIndex
    objects: ObjectInformer  # the namespace's ScaledObjects
    informer: PodInformer | None = None  # its pods, while some followed trigger selects pods
    holders: set[tuple[str, str]] = field(default_factory=set)

    def synced_selection(self, followed: Followed, selector: Selector) -> Selection:
        """The selection of these pods, once their watch has listed them; raises NoData until then."""
        selection = followed.selections.get(selector)
        informer = self.informer
        if selection is None or informer is None:
            raise NoData(f"starting to watch the pods in namespace {self.index.namespace!r}")
        if informer.error is not None:
            raise NoData(informer.error)
        if not informer.synced:
            raise NoData(f"listing the {informer.what} (first list)")
        if not selection.complete:
            raise NoData(f"listing the {informer.what} again (the watch fell too far behind)")
        return selection
