"""Which endpoint picker (EPP) pages a pool's gateway queue is read from, kept current by watches.

For each (namespace, InferencePool, metrics port) that a followed `pending` trigger wants
(wanted.EppPool): the InferencePool → its `spec.endpointPickerRef` (a Service of the same namespace)
→ that Service's selector → its Ready pods → `SCHEME://POD_IP:PORT/metrics`. One watch per namespace
for its InferencePools (however many pool names triggers give: a name that does not exist costs a
look-up in that watch's cache, not a watch of its own), and for each wanted pool that exists, one for
its Service by name and one for the pods it selects: a new EPP replica reaches the gateway source as
its Ready event arrives, and a pool created after the trigger is read without a restart. Nothing
outside the ScaledObject's own namespace is ever watched.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from keda_gpu_scaler.collect.backoff import backoff_delay
from keda_gpu_scaler.collect.supervise import cancel_all
from keda_gpu_scaler.collect.wanted import EppPool
from keda_gpu_scaler.kubernetes.api import INFERENCE_POOLS, SERVICES, KubeApi
from keda_gpu_scaler.kubernetes.informer import ObjectInformer, PodInformer
from keda_gpu_scaler.kubernetes.pods import PodInfo
from keda_gpu_scaler.kubernetes.tls_probe import serves_tls

log = logging.getLogger(__name__)

# The path every EPP (controller-runtime's metrics server) serves its page at.
METRICS_PATH = "/metrics"
# A pod that does not answer on its metrics port yet (just Ready, restarting) is tried again this soon.
PROBE_RETRY_SECONDS = 0.5
PROBE_RETRY_CAP_SECONDS = 10.0

# Whether a server speaks TLS on (host, port): True or False, or raises OSError/TimeoutError.
TlsProbe = Callable[[str, int], Awaitable[bool]]


class GatewaySink(Protocol):
    """Where each wanted pool's EPP pages go (the gateway source): its replicas, or why there are none.

    `unreachable`: the Ready replicas whose metrics port cannot be reached (pod name → why): replicas
    that cannot be read, never replicas left out (they may hold the requests)."""

    def set_replicas(
        self, pool: EppPool, replicas: Mapping[str, str], unreachable: Mapping[str, str] | None = None
    ) -> None: ...

    def set_problem(self, pool: EppPool, message: str, *, absent: bool = False) -> None: ...

    def forget(self, pool: EppPool) -> None: ...


class GatewayBook(GatewaySink, Protocol):
    """The gateway source as discovery sees it: which pools are wanted, and where their pages go."""

    on_pools: Callable[[], None]  # set by discovery: called whenever pools() changes

    def pools(self) -> list[EppPool]: ...


def epp_url(ip: str, port: int, https: bool) -> str:
    host = f"[{ip}]" if ":" in ip else ip
    return f"{'https' if https else 'http'}://{host}:{port}{METRICS_PATH}"


def service_selector(spec: Mapping[str, Any]) -> str | None:
    """A Service's spec.selector as a label selector string (None: it selects no pods by labels)."""
    selector = spec.get("selector")
    if not isinstance(selector, Mapping) or not selector:
        return None
    return ",".join(f"{key}={value}" for key, value in sorted(selector.items()))


@dataclass(eq=False)
class _Probe:
    """What is known of one EPP address: whether it serves HTTPS, or why that is not known yet."""

    https: bool | None = None
    error: str | None = None
    task: asyncio.Task[None] | None = None


@dataclass(eq=False)
class _Pool:
    """One wanted pool name of a namespace: the watches of its picker, and what each port was given."""

    namespace: str
    name: str
    pools: ObjectInformer  # the namespace's InferencePools (shared by its pools)
    ports: set[int] = field(default_factory=set)
    service: ObjectInformer | None = None
    service_name: str | None = None
    pods: PodInformer | None = None
    pod_selector: str | None = None
    published: dict[int, tuple[str, object]] = field(default_factory=dict)  # per port: what the sink has

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(eq=False)
class _Namespace:
    pools: ObjectInformer
    wanted: dict[str, _Pool] = field(default_factory=dict)


class GatewayDiscovery:
    """Follows the EPP replicas of every wanted pool and hands them (or the reason there are none) to a sink.

    `set_wanted(pools)` says which (namespace, pool, port) to follow now (the caller guarantees each
    namespace is that of a followed ScaledObject); those left out stop being watched and are forgotten
    by the sink. Whether an EPP serves HTTPS is found once per address by `probe` (a TLS handshake):
    its page URL says https exactly where it does. A probe ends with the last pool that reads its address.
    """

    def __init__(
        self,
        api: KubeApi,
        sink: GatewaySink,
        *,
        probe: TlsProbe = serves_tls,
        on_restart: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self._api = api
        self._sink = sink
        self._probe = probe
        self._on_restart = on_restart
        self._namespaces: dict[str, _Namespace] = {}
        # (namespace, pod IP, port) → its scheme: by namespace too, so that a pod IP another namespace's
        # picker reuses (the old pod still Terminating) is never handed the other's answer.
        self._probes: dict[tuple[str, str, int], _Probe] = {}

    @property
    def pools(self) -> Mapping[tuple[str, str], object]:
        return {
            (ns, name): pool for ns, space in self._namespaces.items() for name, pool in space.wanted.items()
        }

    def set_wanted(self, wanted: Iterable[EppPool]) -> None:
        """Follow exactly these pools, each at the metrics ports given."""
        ports: dict[tuple[str, str], set[int]] = {}
        for pool in wanted:
            ports.setdefault((pool.namespace, pool.pool), set()).add(pool.port)
        for namespace, space in self._namespaces.items():
            for name, gone in list(space.wanted.items()):
                if (namespace, name) not in ports:
                    self._drop(space, gone)
        for (namespace, name), wanted_ports in ports.items():
            self._set_ports(namespace, name, wanted_ports)
        # Last: a namespace whose pools were all replaced by others keeps its InferencePool watch.
        for namespace, space in list(self._namespaces.items()):
            if not space.wanted:
                space.pools.close()
                del self._namespaces[namespace]
        self._end_unused_probes()

    def _set_ports(self, namespace: str, name: str, wanted_ports: set[int]) -> None:
        space = self._namespaces.get(namespace)
        if space is None:
            space = self._namespaces[namespace] = self._watch_namespace(namespace)
        entry = space.wanted.get(name)
        if entry is None:
            entry = space.wanted[name] = _Pool(namespace, name, space.pools)
            if space.pools.synced:
                self._pool_changed(entry, space.pools.spec(name))
        for port in entry.ports - wanted_ports:
            entry.published.pop(port, None)
            self._sink.forget(EppPool(namespace, name, port))
        entry.ports = set(wanted_ports)
        self._publish(entry)

    async def stop(self) -> None:
        spaces, self._namespaces = self._namespaces, {}
        for space in spaces.values():
            await space.pools.stop()
            for entry in space.wanted.values():
                for informer in (entry.service, entry.pods):
                    if informer is not None:
                        await informer.stop()
        probes, self._probes = self._probes, {}
        await cancel_all(p.task for p in probes.values() if p.task is not None)

    # --- internals ------------------------------------------------------------------------------------

    def _watch_namespace(self, namespace: str) -> _Namespace:
        def on_pool(name: str, spec: Mapping[str, Any] | None) -> None:
            entry = space.wanted.get(name)
            if entry is not None:
                self._pool_changed(entry, spec)

        def on_status() -> None:
            for entry in list(space.wanted.values()):
                self._publish(entry)

        pools = ObjectInformer(
            self._api,
            INFERENCE_POOLS,
            namespace,
            on_pool,
            on_restart=self._on_restart,
            on_status=on_status,
        )
        space = _Namespace(pools)
        pools.start()
        return space

    def _drop(self, space: _Namespace, entry: _Pool) -> None:
        del space.wanted[entry.name]
        for informer in (entry.service, entry.pods):
            if informer is not None:
                informer.close()
        entry.service = entry.pods = None
        for port in entry.ports:
            self._sink.forget(EppPool(entry.namespace, entry.name, port))
        entry.ports = set()
        entry.published.clear()

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
                    name=name,
                    on_object=lambda _, spec: self._service_changed(entry, spec),
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
                on_pod=lambda old, new: self._pod_changed(entry, old, new),
                on_restart=self._on_restart,
                on_status=lambda: self._publish(entry),
            )
            entry.pods.start()

    def _pod_changed(self, entry: _Pool, old: PodInfo | None, new: PodInfo | None) -> None:
        if old is not None and old.ip is not None and (new is None or new.ip != old.ip):
            # The address went with the pod: another pod may get it, serving otherwise.
            for port in entry.ports:
                probe = self._probes.pop((entry.namespace, old.ip, port), None)
                if probe is not None and probe.task is not None:
                    probe.task.cancel()
        self._publish(entry)
        self._end_unused_probes()

    def _end_unused_probes(self) -> None:
        """Probes of addresses no wanted pool reads any more end (and are forgotten)."""
        used = {
            (entry.namespace, pod.ip, port)
            for space in self._namespaces.values()
            for entry in space.wanted.values()
            if entry.pods is not None
            for pod in entry.pods.pods.values()
            if pod.ip
            for port in entry.ports
        }
        for key in [k for k in self._probes if k not in used]:
            probe = self._probes.pop(key)
            if probe.task is not None:
                probe.task.cancel()

    def _scheme(self, namespace: str, ip: str, port: int) -> _Probe:
        """What is known of (ip, port) in `namespace`; starts finding out if nothing is."""
        probe = self._probes.get((namespace, ip, port))
        if probe is None:
            probe = self._probes[(namespace, ip, port)] = _Probe()
            # A task that ends once it knows (supervised() is for tasks that must never end).
            probe.task = asyncio.create_task(
                self._find_scheme(ip, port, probe), name=f"TLS probe {ip}:{port}"
            )
        return probe

    async def _find_scheme(self, ip: str, port: int, probe: _Probe) -> None:
        failures = 0
        while True:
            try:
                probe.https = await self._probe(ip, port)
                probe.error = None
                break
            except Exception as error:
                failures += 1
                if isinstance(error, TimeoutError):
                    detail = "timed out"
                elif isinstance(error, OSError):
                    detail = error.strerror or str(error)
                else:
                    log.exception("TLS probe of %s:%d failed", ip, port)
                    detail = f"{type(error).__name__}: {error}"
                probe.error = f"cannot connect to {ip}:{port} ({detail})"
                self._publish_all()
                await asyncio.sleep(
                    backoff_delay(failures, first=PROBE_RETRY_SECONDS, cap=PROBE_RETRY_CAP_SECONDS)
                )
        probe.task = None
        log.info("endpoint picker %s:%d serves %s", ip, port, "HTTPS" if probe.https else "plain HTTP")
        self._publish_all()

    def _publish_all(self) -> None:
        for space in list(self._namespaces.values()):
            for entry in list(space.wanted.values()):
                self._publish(entry)

    def _state(self, entry: _Pool, port: int) -> tuple[str, object]:
        """What the sink should know about the pool at a port now: its replicas' pages, or why it has none."""
        what = f"InferencePool {entry.ref}"
        informer = entry.pools
        # A watch failing after its first list keeps what it last read (client-go's informers do too): the
        # pickers already known are still read, rather than the pool turning UNAVAILABLE for the backoff.
        if informer.error is not None and not informer.synced:
            return "problem", f"cannot read {what}: {informer.error}"
        if not informer.synced:
            return "problem", f"reading {what} from the Kubernetes API (first look-up)"
        spec = informer.spec(entry.name)
        if spec is None:
            existing = sorted(informer.items)
            closest = difflib.get_close_matches(entry.name, existing, n=3, cutoff=0.6)
            ordered = closest + [name for name in existing if name not in closest]
            return "absent", (
                f"{what} does not exist (no InferencePool {entry.name!r} of inference.networking.k8s.io/v1"
                f" in namespace {entry.namespace!r}; those that exist: {', '.join(ordered[:10]) or 'none'});"
                " its queue is read as soon as it is created"
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
        if service.error is not None and not service.synced:
            return "problem", f"cannot read {service_ref} (the endpoint picker of {what}): {service.error}"
        if not service.synced:
            return "problem", f"reading {service_ref} (the endpoint picker of {what}) (first look-up)"
        if entry.service_name is None or service.spec(entry.service_name) is None:
            return "problem", f"{service_ref}, named by {what} as its endpointPickerRef, does not exist"
        if entry.pods is None:
            return (
                "problem",
                f"{service_ref} (the endpoint picker of {what}) has no spec.selector: no pods to read",
            )
        pods = entry.pods
        if pods.error is not None and not pods.synced:
            return "problem", f"cannot read the endpoint picker pods of {what}: {pods.error}"
        if not pods.synced:
            return "problem", f"listing the endpoint picker pods of {what} (first list)"
        ready = sorted((p for p in pods.pods.values() if p.counts_as_target and p.ip), key=lambda p: p.name)
        if not ready:
            return "problem", (
                f"no Ready endpoint picker pod for {what} ({service_ref} selects {entry.pod_selector!r};"
                f" {len(pods.pods)} pod(s) match, none Ready with an IP)"
            )
        replicas: dict[str, str] = {}
        unreachable: dict[str, str] = {}
        for pod in ready:
            assert pod.ip is not None
            probe = self._scheme(entry.namespace, pod.ip, port)
            if probe.https is None:
                unreachable[pod.name] = probe.error or f"connecting to {pod.ip}:{port}"
            else:
                replicas[pod.name] = epp_url(pod.ip, port, probe.https)
        if not replicas:
            # Not read before it is known whether it serves HTTPS: the token goes over verified TLS only.
            unknown = "; ".join(f"{name}: {why}" for name, why in unreachable.items())
            return "problem", (
                f"endpoint picker pods of {what} not reachable on metrics port {port} yet ({unknown})"
            )
        # A Ready replica that cannot be reached is handed on as one that cannot be read: left out, the
        # pool would read as the others' queue alone, a made-up 0 while it may hold the requests.
        reasons = {name: f"not reachable on metrics port {port}: {why}" for name, why in unreachable.items()}
        return "replicas", (replicas, reasons)

    def _publish(self, entry: _Pool) -> None:
        for port in sorted(entry.ports):
            state = self._state(entry, port)
            if state == entry.published.get(port):
                continue
            entry.published[port] = state
            kind, value = state
            pool = EppPool(entry.namespace, entry.name, port)
            if kind == "replicas":
                assert isinstance(value, tuple)
                replicas, unreachable = value
                log.info("InferencePool %s: endpoint picker pages %s", entry.ref, sorted(replicas.values()))
                self._sink.set_replicas(pool, dict(replicas), dict(unreachable))
            else:
                self._sink.set_problem(pool, str(value), absent=kind == "absent")
