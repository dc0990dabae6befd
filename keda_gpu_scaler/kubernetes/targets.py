"""Target resolution: which pods each followed selector picks in a namespace, kept current pod event by pod event.

A pod event in a namespace touches only the selectors of that namespace that could match the pod (found
through an index on their `key=value` requirements), and of those only the ones it matched before or
matches now; resolve() then reads a set built once per change.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from types import MappingProxyType

from keda_gpu_scaler.core.selectors import Op, Selector
from keda_gpu_scaler.core.snapshot import PodEndpoint, Targets
from keda_gpu_scaler.kubernetes.pods import PodInfo


def endpoint(pod: PodInfo) -> PodEndpoint:
    ports = {name: number for name, number in pod.ports if name}
    return PodEndpoint(pod.name, pod.ip, pod.counts_as_target, MappingProxyType(ports), pod.node, pod.ports)


class _Endpoints(Mapping[str, PodEndpoint]):
    """Pod name → PodEndpoint, built when read: most answers are never asked for their endpoints, and
    building them on every pod event would only make garbage on the hot path."""

    __slots__ = ("_pods",)

    def __init__(self, pods: dict[str, PodInfo]) -> None:
        self._pods = pods  # a copy owned by this snapshot

    def __getitem__(self, name: str) -> PodEndpoint:
        return endpoint(self._pods[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._pods)

    def __len__(self) -> int:
        return len(self._pods)


# version, target pods, endpoints, occupied nodes, starting pods: what readers are given, built once per
# change.
_Snapshot = tuple[int, frozenset[str], Mapping[str, PodEndpoint], frozenset[str], frozenset[str]]


class Selection:
    """What one selector picks in one namespace's pods, updated one pod event at a time."""

    def __init__(self, selector: Selector) -> None:
        self.selector = selector
        self.users: set[object] = set()
        self._members: dict[str, PodInfo] = {}  # every matching pod, by name
        self._targets: set[str] = set()
        self._starting: set[str] = set()
        self._target_nodes: Counter[str] = Counter()
        self._occupied: Counter[str] = Counter()  # nodes of matching pods worth scraping
        self.version = 0  # moves on with every change of the targets, their nodes or the endpoints
        self._snapshot: _Snapshot | None = None
        # While the namespace's pods are being listed again, readers get the snapshot from before the
        # relist began: its differences arrive in slices, and a half-applied relist (the deletions of a
        # rollout before its additions) would read as fewer pods. None: answers follow every event.
        self._held: _Snapshot | None = None
        # False for a selection that started during a relist: it has no whole snapshot to answer from yet.
        self.complete = True
        # When its last target or starting pod went (monotonic seconds): a /scale read that began before
        # then may count replicas that have gone since (a scale to zero), so it cannot say that replicas
        # are missing (SPEC §4). A selection that never had a pod has none that could have gone.
        self.emptied_at = -math.inf

    @property
    def has_pods(self) -> bool:
        return bool(self._targets or self._starting)

    def update(self, old: PodInfo | None, new: PodInfo | None) -> bool:
        """Take one pod event; True when it left the selection with no target or starting pod."""
        had_pods = self.has_pods
        self._apply(old, new)
        if had_pods and not self.has_pods:
            self.emptied_at = time.monotonic()
            return True
        return False

    def _apply(self, old: PodInfo | None, new: PodInfo | None) -> None:
        name = (new or old).name  # type: ignore[union-attr]
        was = self._members.pop(name, None)
        if was is not None:
            self._drop(was)
        if new is not None and self.selector.matches(new.labels):
            self._members[name] = new
            self._add(new)
        elif was is None:
            return  # neither matched before nor matches now: nothing changed
        self.version += 1

    def _add(self, pod: PodInfo) -> None:
        if pod.starting:
            self._starting.add(pod.name)
        if pod.counts_as_target:
            self._targets.add(pod.name)
            if pod.node is not None:
                self._target_nodes[pod.node] += 1
        if pod.occupies_node and pod.node is not None:
            self._occupied[pod.node] += 1

    def _drop(self, pod: PodInfo) -> None:
        self._starting.discard(pod.name)
        if pod.counts_as_target:
            self._targets.discard(pod.name)
            if pod.node is not None:
                self._target_nodes[pod.node] -= 1
                if not self._target_nodes[pod.node]:
                    del self._target_nodes[pod.node]
        if pod.occupies_node and pod.node is not None:
            self._occupied[pod.node] -= 1
            if not self._occupied[pod.node]:
                del self._occupied[pod.node]

    @property
    def target_nodes(self) -> Mapping[str, int]:
        return self._target_nodes

    def hold(self) -> None:
        """Answer from the pods as they are now until release() (a relist is about to be applied)."""
        self._current()
        self._held = self._snapshot

    def release(self) -> None:
        self._held = None
        self.complete = True

    def targets(self, metric_type: str | None) -> Targets:
        """The current Targets (the snapshot's pods and endpoints are built at most once per change)."""
        snapshot = self._held or self._current()
        return Targets(snapshot[1], metric_type, snapshot[4], snapshot[2], snapshot[3])

    def _current(self) -> _Snapshot:
        if self._snapshot is None or self._snapshot[0] != self.version:
            endpoints = _Endpoints(
                {name: p for name, p in self._members.items() if p.occupies_node or p.counts_as_target}
            )
            self._snapshot = (
                self.version,
                frozenset(self._targets),
                endpoints,
                frozenset(self._occupied),
                frozenset(self._starting),
            )
        return self._snapshot


def _index_key(selector: Selector) -> tuple[str, str] | None:
    """A (label, value) every pod the selector matches must carry, if the selector has one."""
    for requirement in selector.requirements:
        if requirement.op is Op.EQUALS and len(requirement.values) == 1:
            return requirement.key, next(iter(requirement.values))
    return None


class NamespaceIndex:
    """The selections followed in one namespace, and which of them a pod event can touch."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.selections: dict[Selector, Selection] = {}
        self._by_label: dict[tuple[str, str], set[Selection]] = {}
        self._scan: set[Selection] = set()  # selectors without a key=value requirement: always checked
        self._holding = False

    def acquire(self, selector: Selector, user: object, pods: Mapping[str, PodInfo]) -> Selection:
        """Follow selector for user; a new selection starts from the namespace's pods as cached now."""
        selection = self.selections.get(selector)
        if selection is None:
            selection = Selection(selector)
            self.selections[selector] = selection
            key = _index_key(selector)
            if key is None:
                self._scan.add(selection)
            else:
                self._by_label.setdefault(key, set()).add(selection)
            for pod in pods.values():
                selection.update(None, pod)
            # Started from a cache that a relist is half way through: not an answer until it ends.
            selection.complete = not self._holding
        selection.users.add(user)
        return selection

    def hold(self, holding: bool) -> None:
        """A relist starts (True) or has been applied whole (False): see Selection.hold."""
        self._holding = holding
        for selection in self.selections.values():
            if holding:
                selection.hold()
            else:
                selection.release()

    def release(self, selector: Selector, user: object) -> None:
        selection = self.selections.get(selector)
        if selection is None:
            return
        selection.users.discard(user)
        if selection.users:
            return
        del self.selections[selector]
        key = _index_key(selector)
        if key is None:
            self._scan.discard(selection)
        else:
            group = self._by_label.get(key)
            if group is not None:
                group.discard(selection)
                if not group:
                    del self._by_label[key]

    def release_all(self) -> None:
        self.selections.clear()
        self._by_label.clear()
        self._scan.clear()

    def on_pod(self, old: PodInfo | None, new: PodInfo | None) -> list[Selection]:
        """Take one pod event; the selections it left with no target or starting pod."""
        touched = set(self._scan)
        for pod in (old, new):
            if pod is not None:
                for item in pod.labels.items():
                    group = self._by_label.get(item)
                    if group:
                        touched.update(group)
        return [selection for selection in touched if selection.update(old, new)]
