"""What decide() reads for one followed trigger: the snapshot and the shapes it is made of.

The collectors, the store and discovery fill these (collect/, kubernetes/); the pure decision (decide.py)
only reads them, so they live here, below everything that builds them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from keda_gpu_scaler.core.demand import DemandPoint
from keda_gpu_scaler.core.pending import ReplicaInput
from keda_gpu_scaler.pages.engines import Missing, PodSamples
from keda_gpu_scaler.pages.vendors import GpuReading


class Reading(Protocol):
    """What the store keeps of a page, whatever its kind: GPU readings (exporters), PodSamples (inference
    servers), ReplicaQueue and ReplicaLost (endpoint pickers). Each names its namespace and the pod it
    is about; readers take the type their source kind holds (SourceKind says which)."""

    @property
    def namespace(self) -> str: ...

    @property
    def pod(self) -> str: ...


class SourceKind(StrEnum):
    SCRAPE = "scrape"  # an exporter page, naming pods of any namespace
    PROMETHEUS = "prometheus"  # one namespace's query results from a Prometheus-compatible API
    # Inference-server pages (SPEC §6): elements are collect.inference.PodSamples, not GPU readings.
    INFERENCE = "inference"  # one pod's own page (its namespace is known)
    PROMETHEUS_INFERENCE = "prometheus-inference"  # one namespace's engine series through Prometheus
    # Endpoint-picker pages (SPEC §7): one EPP replica's page of one InferencePool; elements are
    # collect.gateway_source.ReplicaQueue.
    GATEWAY = "gateway"
    # One InferencePool's endpoint-picker series through Prometheus: elements are ReplicaQueue (fresh
    # replicas, summed when the answer came) and prometheus_answer.ReplicaLost (replicas seen before that
    # cannot be read now, or whose series are not a queue).
    PROMETHEUS_GATEWAY = "prometheus-gateway"


@dataclass(frozen=True, slots=True)
class NamespaceView:
    """What the store knows of one namespace at one instant."""

    readings: tuple[Reading, ...]  # from fresh pages only
    fresh: tuple[str, ...]  # the sources whose pages are fresh
    sources: int
    # pod → reason, for pods last seen on a source that is now failing, stale or without pod labels
    recently_seen: dict[str, str] = field(default_factory=dict)
    problems: tuple[str, ...] = ()  # one line per source without fresh data that is not one pod's own page
    # pod → the problem of its own page (an inference server's), for the triggers that read that pod
    pod_problems: dict[str, str] = field(default_factory=dict)
    # pod → what a recently seen pod was read as: its GPU families, or OWN_PAGE for its own page (a
    # trigger counts it missing only where it read it: a vendor's families, or the pods' own pages).
    seen_as: dict[str, frozenset[Any]] = field(default_factory=dict)

    def read_as(self, pod: str, kinds: Collection[Any]) -> bool:
        """Whether recently seen `pod` was read as one of `kinds` (not known: counted, never forgotten)."""
        seen = self.seen_as.get(pod)
        return not seen or any(kind in seen for kind in kinds)

    @property
    def fresh_sources(self) -> int:
        return len(self.fresh)


# What a pod's own page (an inference server's) is read as, beside the GPU families of exporters' pages.
OWN_PAGE = "own page"


@dataclass(frozen=True, slots=True)
class PodEndpoint:
    """Where one selected pod can be reached: for talking to the pod itself (e.g. an inference server)."""

    name: str
    ip: str | None  # None until the pod has one
    ready: bool  # Running, Ready and not being deleted: the HPA's (and a load balancer's) ready pod
    ports: Mapping[str, int]  # named TCP container ports of all its containers: name → number
    node: str | None = None
    # Every TCP container port in the pod spec's order, named or not: (name, number).
    port_list: tuple[tuple[str | None, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Targets:
    """A ScaledObject's target pods as discovery knows them."""

    pods: frozenset[str]  # names of the pods that count as targets (Running, Ready, not being deleted)
    metric_type: str | None = None  # the trigger's metricType ("AverageValue" or "Value") when read
    # Pods the selector picks that exist but are not Ready yet (SPEC §4's starting pods).
    starting: frozenset[str] = frozenset()
    # Every pod the selector picks that is scheduled and not finished (targets and pods not ready yet),
    # by name. Not compared: the same target pods are the same Targets for the evaluation.
    endpoints: Mapping[str, PodEndpoint] = field(default_factory=dict, compare=False, hash=False, repr=False)
    # The nodes those pods occupy (scheduled, not finished): where their GPU exporters are read.
    nodes: frozenset[str] = field(default=frozenset(), compare=False, hash=False, repr=False)
    # With no pod at all: the scale target's spec.replicas, from a /scale read since its pods last went
    # (None: not known, or it has pods). Replicas with no pod (a quota, a webhook) is not zero (SPEC §4).
    replicas: int | None = None


@dataclass(frozen=True, slots=True)
class Track:
    """A page read one way (engine, model) over a window: the rate's two ends, or why it has none."""

    points: list[DemandPoint]
    used: int = 0  # the pages read within the window
    # The newest page's reading where it gives no point (a NaN counter, a family gone): the pod is
    # missing until a page gives one again, whatever older points say.
    problem: Missing | None = None
    engine: str = "unknown"  # what the newest page was read as (for /explain)
    # The latency histograms' increases over the window (role `KIND:le=BOUND`, `KIND:sum`, `KIND:count`
    # → increase, summed over the model's series): what latency.py reads; empty without two points.
    latency: Mapping[str, float] = field(default_factory=dict)
    # The newest page prints token counters without a value (NaN): a `demandUnit: tokens` read of the pod
    # is missing (its rate would miss that page's tokens), not an engine that prints none.
    tokens_problem: Missing | None = None


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """The trigger's InferencePool as its endpoint pickers' pages say now."""

    replicas: tuple[ReplicaInput, ...]  # each replica page: its fresh queue or why it has none
    no_replica: str  # why there is no replica at all (the message when there is none)
    unknown: str | None = None  # why the pool does not exist (naming those that do), else None
    unreadable: str | None = None  # why no replica can be told at all (Prometheus failing), else None
    # `demand`: each replica's pending growth per second over the window, at its pages' times.
    growth: Mapping[str, float] = field(default_factory=dict)
    tokens_per_request: float | None = None  # `demand`: the last the pods measured (None: never)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything decide() reads for one trigger. New readings (e.g. latency histograms) are new fields."""

    namespace: str
    now: float
    kind: SourceKind
    targets: Targets | None = None  # what Kubernetes discovery says; None without Kubernetes
    view: NamespaceView | None = None  # the namespace's fresh readings; None: discovery says no pods
    gpu: tuple[GpuReading, ...] = ()  # the target pods' GPU readings
    pods: tuple[PodSamples, ...] = ()  # the target pods' inference pages
    target_pods: frozenset[str] = frozenset()  # every pod that counts, read or not
    tracks: tuple[tuple[str, Track], ...] = ()  # `demand`: each pod page over the window
    pool: PoolSnapshot | None = None  # `pending`, and `demand` with inferencePool
    # `demand` with a latency target: the fresh pods' summed demand at recent decisions, oldest first.
    recent_demand: tuple[float, ...] = ()
    # `demand` with a latency target: (requests, requests over a target) of recent windows, oldest first.
    recent_latency: tuple[tuple[float, float], ...] = ()
