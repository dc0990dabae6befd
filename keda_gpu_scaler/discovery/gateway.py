"""Which endpoint picker (EPP) pages a pool's gateway queue is read from, kept current by watches.

For each (namespace, InferencePool) that a followed `pending` trigger names: the InferencePool →
its `spec.endpointPickerRef` (a Service of the same namespace) → that Service's selector → its Ready
pods → `SCHEME://POD_IP:PORT/metrics`. Three watches per pool (the pool and the Service by name, the
pods by the Service's labels), so a new EPP replica reaches the gateway source as its Ready event
arrives, and a pool created after the trigger is read without a restart. Nothing outside the
ScaledObject's own namespace is ever watched: the pool, the Service and the pods are all looked up
there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from keda_gpu_scaler.discovery.api import INFERENCE_POOLS, SERVICES, KubeApi
from keda_gpu_scaler.discovery.informer import ObjectInformer, PodInformer
from keda_gpu_scaler.discovery.pods import PodInfo

log = logging.getLogger(__name__)

DEFAULT_GATEWAY_METRICS_PORT = 9090
# The path every EPP (controller-runtime's metrics server) serves its page at.
METRICS_PATH = "/metrics"


class GatewaySink(Protocol):
    """Where each pool's EPP pages go (the gateway source): its replicas, or why there are none."""

    def set_replicas(self, namespace: str, pool: str, replicas: Mapping[str, str]) -> None: ...

    def set_problem(self, namespace: str, pool: str, message: str) -> None: ...


def epp_url(pod: PodInfo, port: int, https: bool) -> str | None:
    """The EPP page of one Ready pod, or None while it has no address or is not Ready."""
    if pod.ip is None or not pod.counts_as_target:
        return None
    host = f"[{pod.ip}]" if ":" in pod.ip else pod.ip
    return f"{'https' if https else 'http'}://{host}:{port}{METRICS_PATH}"


def service_selector(spec: Mapping[str, Any]) -> str | None:
    """A Service's spec.selector as a label selector string (None: it selects no pods by labels)."""
    selector = spec.get("selector")
    if not isinstance(selector, Mapping) or not selector:
        return None
    return ",".join(f"{key}={value}" for key, value in sorted(selector.items()))


@dataclass(eq=False)
class _Pool:
    """The watches of one (namespace, pool) and what was last handed to the sink."""

    namespace: str
    name: str
    port: int
    holders: dict[str, int] = field(default_factory=dict)  # ScaledObject name → its gatewayMetricsPort
    pool: ObjectInformer | None = None
    service: ObjectInformer | None = None
    service_name: str | None = None
    pods: PodInformer | None = None
    pod_selector: str | None = None
    published: tuple[str, object] | None = None  # ("replicas", mapping) or ("problem", message)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


class GatewayDiscovery:
    """Follows the EPP replicas of every wanted pool and hands them (or the reason there are none) to a sink.

    `want(namespace, pool, holder, port)` is called for each ScaledObject that has a `pending` trigger
    on that pool, `release(namespace, holder)` when it has none any more; the watches of a pool stop when
    its last holder goes.
    """

    def __init__(
        self,
        api: KubeApi,
        sink: GatewaySink,
        *,
        https: bool = False,
        on_restart: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self._api = api
        self._sink = sink
        self._https = https
        self._on_restart = on_restart
        self._pools: dict[tuple[str, str], _Pool] = {}
        self._held: dict[tuple[str, str], set[str]] = {}  # (namespace, ScaledObject) → its pools

    @property
    def pools(self) -> Mapping[tuple[str, str], object]:
        return self._pools

    def want(self, namespace: str, pool: str, holder: str, port: int = DEFAULT_GATEWAY_METRICS_PORT) -> None:
        """ScaledObject `holder` of `namespace` reads pool `pool` (always of the same namespace) at `port`."""
        entry = self._pools.get((namespace, pool))
        if entry is None:
            entry = _Pool(namespace, pool, port)
            self._pools[(namespace, pool)] = entry
            entry.pool = ObjectInformer(
                self._api,
                INFERENCE_POOLS,
                namespace,
                pool,
                on_object=lambda spec: self._pool_changed(entry, spec),
                on_restart=self._on_restart,
                on_status=lambda: self._publish(entry),
            )
            entry.pool.start()
            self._publish(entry)
        self._held.setdefault((namespace, holder), set()).add(pool)
        if entry.holders.get(holder) != port:
            entry.holders[holder] = port
            self._set_port(entry)

    def wanted(self, namespace: str, holder: str) -> frozenset[str]:
        return frozenset(self._held.get((namespace, holder), ()))

    def release(self, namespace: str, holder: str, keep: frozenset[str] = frozenset()) -> None:
        """ScaledObject `holder` no longer reads the pools it held, except those in `keep`."""
        pools = self._held.get((namespace, holder))
        if not pools:
            return
        for pool in [p for p in pools if p not in keep]:
            pools.discard(pool)
            entry = self._pools.get((namespace, pool))
            if entry is None:
                continue
            entry.holders.pop(holder, None)
            if entry.holders:
                self._set_port(entry)
            else:
                self._drop(entry)
        if not pools:
            del self._held[(namespace, holder)]

    async def stop(self) -> None:
        pools, self._pools = self._pools, {}
        self._held.clear()
        for entry in pools.values():
            for informer in (entry.pool, entry.service, entry.pods):
                if informer is not None:
                    await informer.stop()

    # --- internals ------------------------------------------------------------------------------------

    def _drop(self, entry: _Pool) -> None:
        del self._pools[(entry.namespace, entry.name)]
        for informer in (entry.pool, entry.service, entry.pods):
            if informer is not None:
                informer.close()
        entry.pool = entry.service = entry.pods = None
        # Nothing more is said to the sink: the gateway source drops the pool with its last trigger.

    def _set_port(self, entry: _Pool) -> None:
        # Triggers naming one pool normally agree; if they do not, the lowest port is read (stable choice).
        port = min(entry.holders.values())
        if port != entry.port:
            entry.port = port
            self._publish(entry)

    def _pool_changed(self, entry: _Pool, spec: Mapping[str, Any] | None) -> None:
        name: str | None = None
        if spec is not None:
            ref = spec.get("endpointPickerRef")
            if (
                isinstance(ref, Mapping)
                and (ref.get("kind") or "Service") == "Service"
                and not ref.get("group")
            ):
                name = str(ref.get("name") or "") or None
        if name != entry.service_name:
            if entry.service is not None:
                entry.service.close()
                entry.service = None
            self._set_pod_selector(entry, None)
            entry.service_name = name
            if name is not None:
                entry.service = ObjectInformer(
                    self._api,
                    SERVICES,
                    entry.namespace,
                    name,
                    on_object=lambda spec: self._service_changed(entry, spec),
                    on_restart=self._on_restart,
                    on_status=lambda: self._publish(entry),
                )
                entry.service.start()
        self._publish(entry)

    def _service_changed(self, entry: _Pool, spec: Mapping[str, Any] | None) -> None:
        self._set_pod_selector(entry, service_selector(spec) if spec is not None else None)
        self._publish(entry)

    def _set_pod_selector(self, entry: _Pool, selector: str | None) -> None:
        if selector == entry.pod_selector:
            return
        if entry.pods is not None:
            entry.pods.close()
            entry.pods = None
        entry.pod_selector = selector
        if selector is not None:
            entry.pods = PodInformer(
                self._api,
                namespace=entry.namespace,
                label_selector=selector,
                on_pod=lambda old, new: self._publish(entry),
                on_restart=self._on_restart,
                on_status=lambda: self._publish(entry),
            )
            entry.pods.start()

    def _state(self, entry: _Pool) -> tuple[str, object]:
        """What the sink should know about the pool now: its replicas' pages, or why it has none."""
        what = f"InferencePool {entry.ref}"
        informer = entry.pool
        assert informer is not None
        if informer.error is not None:
            return "problem", f"cannot read {what}: {informer.error}"
        if not informer.synced:
            return "problem", f"reading {what} from the Kubernetes API (first look-up)"
        spec = informer.spec
        if spec is None:
            return "problem", (
                f"{what} does not exist (no InferencePool {entry.name!r} of inference.networking.k8s.io/v1"
                f" in namespace {entry.namespace!r}); its queue is read as soon as it is created"
            )
        ref = spec.get("endpointPickerRef")
        if not isinstance(ref, Mapping) or not ref.get("name"):
            return (
                "problem",
                f"{what} has no spec.endpointPickerRef.name: it names no endpoint picker to read",
            )
        kind = str(ref.get("kind") or "Service")
        group = str(ref.get("group") or "")
        if kind != "Service" or group:
            of_group = f" of group {group!r}" if group else ""
            return "problem", (
                f"{what}: spec.endpointPickerRef is a {kind!r}{of_group} ({ref.get('name')!r}), not a Service;"
                " the scaler finds the endpoint picker's pods through a Service of the pool's namespace only"
            )
        service = entry.service
        assert service is not None
        service_ref = f"Service {entry.namespace}/{entry.service_name}"
        if service.error is not None:
            return "problem", f"cannot read {service_ref} (the endpoint picker of {what}): {service.error}"
        if not service.synced:
            return "problem", f"reading {service_ref} (the endpoint picker of {what}) (first look-up)"
        if service.spec is None:
            return "problem", f"{service_ref}, named by {what} as its endpointPickerRef, does not exist"
        if entry.pods is None:
            return (
                "problem",
                f"{service_ref} (the endpoint picker of {what}) has no spec.selector: no pods to read",
            )
        pods = entry.pods
        if pods.error is not None:
            return "problem", f"cannot read the endpoint picker pods of {what}: {pods.error}"
        if not pods.synced:
            return "problem", f"listing the endpoint picker pods of {what} (first list)"
        replicas = {
            pod.name: url
            for pod in pods.pods.values()
            if (url := epp_url(pod, entry.port, self._https)) is not None
        }
        if not replicas:
            return "problem", (
                f"no Ready endpoint picker pod for {what} ({service_ref} selects {entry.pod_selector!r};"
                f" {len(pods.pods)} pod(s) match, none Ready with an IP)"
            )
        return "replicas", replicas

    def _publish(self, entry: _Pool) -> None:
        if entry.pool is None:
            return  # dropped
        state = self._state(entry)
        if state == entry.published:
            return
        entry.published = state
        kind, value = state
        if kind == "replicas":
            assert isinstance(value, dict)
            log.info("InferencePool %s: endpoint picker pages %s", entry.ref, sorted(value.values()))
            self._sink.set_replicas(entry.namespace, entry.name, dict(value))
        else:
            self._sink.set_problem(entry.namespace, entry.name, str(value))
