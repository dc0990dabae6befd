"""Gateway pages (SPEC §7): which endpoint-picker (EPP) replica pages are scraped for which InferencePool.

The queue that wakes a workload from zero lives in the inference gateway's endpoint picker, not in any
pod of the target. One InferencePool has one or more EPP replicas (active-active: each keeps its own
queue), and each replica serves one metrics page. GatewayPages is the one place that knows, per
(namespace, pool), which replica pages exist and why there are none; it turns that into the gateway
collector's sources and answers the evaluation's read-only questions.

Who feeds it:
- Kubernetes discovery: for every pool in `wanted()`, InferencePool → `endpointPickerRef` Service → its
  Ready pods → `set_replicas(namespace, pool, {pod name: metrics URL})`, or `set_problem(...)` when
  there is no replica to read (the pool does not exist yet, its endpointPickerRef is not a Service, no
  Ready EPP pod). Call again on every change; calls that change nothing cost nothing. `forget()` when a
  pool leaves `wanted()`.
- `--gateway-url NAMESPACE/POOL=URL` (no Kubernetes): `add_static()` once per flag at start-up.

Who reads it: the `pending` evaluation (`replicas()`, `problem()`), which never adds or removes anything.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Protocol

from keda_gpu_scaler.gateways import DEFAULT_GATEWAY_METRICS_PORT

PoolKey = tuple[str, str]
"""(namespace, InferencePool name)."""


@dataclass(frozen=True, slots=True)
class GatewayPool:
    """The interest key of a followed `pending` trigger: the pool it reads and the EPP metrics port.

    The registry touches it on every call about the trigger (the same interest TTL as every other
    source), so a pool is wanted exactly while some followed ScaledObject asks about it.
    """

    namespace: str
    pool: str
    port: int = DEFAULT_GATEWAY_METRICS_PORT


class InterestKeys(Protocol):
    """What GatewayPages needs of collect.interest.Interest."""

    def wanted_keys(self) -> list[Hashable]: ...

    def wanted(self, key: Hashable) -> bool: ...

    async def wait_until_wanted(self, timeout: float, key: Hashable) -> None: ...


class GatewaySink(Protocol):
    """Where replica pages go: the gateway scrape collector (one store source per replica page)."""

    def add_replica_page(self, url: str, namespace: str, pool: str, replica: str) -> None: ...

    def remove(self, url: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Replica:
    """One EPP replica page of a pool: `name` is the EPP pod (the URL itself for a --gateway-url)."""

    name: str
    url: str
    static: bool


class GatewayPages:
    """Per (namespace, pool): its EPP replica pages, or why there are none (see the module docstring).

    Interface (stable; safe to call any number of times, from the event loop):

    - `wanted() -> dict[(namespace, pool), port]`: the pools some followed `pending` trigger asked about
      within the interest TTL, with the EPP metrics port to use (`gatewayMetricsPort`, default 9090; if
      triggers about one pool name different ports, the lowest). Only namespaces of followed ScaledObjects
      ever appear: a trigger cannot name another namespace.
    - `await wait_for_wanted(timeout)`: returns when a pool (or anything else) becomes newly wanted, or
      after `timeout` seconds; a watcher loops on it and re-reads `wanted()`.
    - `set_replicas(namespace, pool, replicas)`: `replicas` maps each Ready EPP pod's name to its metrics
      URL (`http://IP:PORT/metrics`, or `https://…` where the EPP serves TLS). Replaces the pool's
      discovered replicas whole: pages no longer named stop being scraped and their data is dropped, new
      ones are scraped at once; clears the pool's problem. An empty mapping is a problem: use
      `set_problem` to say why (an empty mapping alone reads as "no EPP pod of pool P is Ready").
    - `set_problem(namespace, pool, message)`: there is no replica to read, and `message` says why in the
      user's words, naming the object (e.g. "InferencePool llm/chat-pool does not exist"). Drops the
      pool's discovered replicas. The `pending` trigger answers UNAVAILABLE with this message.
    - `forget(namespace, pool)`: the pool is no longer watched; its discovered replicas and problem go.
    - `add_static(namespace, pool, url)`: a `--gateway-url`; kept for the process's life, beside any
      discovered replicas of the same pool.

    Read side (the evaluation): `replicas(namespace, pool)` and `problem(namespace, pool)`.
    """

    def __init__(self, interest: InterestKeys) -> None:
        self._interest = interest
        self.sink: GatewaySink | None = None  # set once the HTTP session exists (App.start)
        self._static: dict[PoolKey, dict[str, Replica]] = {}
        self._discovered: dict[PoolKey, dict[str, Replica]] = {}
        self._problems: dict[PoolKey, str] = {}
        self._pending: list[tuple[str, PoolKey, Replica]] = []  # static pages given before the sink
        self._owner: dict[str, PoolKey] = {}  # url → the pool whose page it is (the first to name it)
        self._users: dict[str, int] = {}  # url → how many replica entries name it

    # -- what is wanted ------------------------------------------------------------------------------

    def wanted(self) -> dict[PoolKey, int]:
        ports: dict[PoolKey, int] = {}
        for key in self._interest.wanted_keys():
            if isinstance(key, GatewayPool):
                pool = (key.namespace, key.pool)
                ports[pool] = min(ports.get(pool, key.port), key.port)
        return ports

    def is_wanted(self, pool: PoolKey) -> bool:
        """Whether some followed trigger reads this pool now (its pages are scraped only then)."""
        return pool in self.wanted()

    async def wait_for_wanted(self, timeout: float) -> None:
        await self._interest.wait_until_wanted(timeout, _NEVER_TOUCHED)

    # -- the Kubernetes side and the static flag -----------------------------------------------------

    def set_replicas(self, namespace: str, pool: str, replicas: Mapping[str, str]) -> None:
        key = (namespace, pool)
        self._problems.pop(key, None)
        new = {name: Replica(name, url, static=False) for name, url in replicas.items()}
        before = self._discovered.get(key, {})
        if before == new:
            return
        if new:
            self._discovered[key] = new
        else:
            self._discovered.pop(key, None)
        for name, replica in new.items():
            if before.get(name) != replica:
                self._use(key, replica)
        for name, replica in before.items():
            if new.get(name) != replica:
                self._release(replica.url)

    def set_problem(self, namespace: str, pool: str, message: str) -> None:
        self.set_replicas(namespace, pool, {})
        self._problems[(namespace, pool)] = message

    def forget(self, namespace: str, pool: str) -> None:
        self.set_replicas(namespace, pool, {})
        self._problems.pop((namespace, pool), None)

    def add_static(self, namespace: str, pool: str, url: str) -> None:
        key = (namespace, pool)
        replicas = self._static.setdefault(key, {})
        if url in replicas:
            return
        replica = Replica(url, url, static=True)
        replicas[url] = replica
        self._use(key, replica)

    def start(self, sink: GatewaySink) -> None:
        """Hand every page named so far to the collector's sink; from now on pages go there directly."""
        self.sink = sink
        pending, self._pending = self._pending, []
        for url, (namespace, pool), replica in pending:
            if self._users.get(url):
                sink.add_replica_page(url, namespace, pool, replica.name)

    # -- the read side -------------------------------------------------------------------------------

    def replicas(self, namespace: str, pool: str) -> tuple[Replica, ...]:
        """The pool's replica pages (static first, then discovered, each by name); empty when none.

        A URL named by two pools (a repeated --gateway-url) belongs to the first that named it: its
        page is read for that pool only, and the other pool does not list it."""
        key = (namespace, pool)
        found = [
            *self._static.get(key, {}).values(),
            *sorted(self._discovered.get(key, {}).values(), key=_name),
        ]
        return tuple(r for r in found if self._owner.get(r.url) == key)

    def problem(self, namespace: str, pool: str) -> str | None:
        return self._problems.get((namespace, pool))

    # -- bookkeeping ---------------------------------------------------------------------------------

    def _use(self, key: PoolKey, replica: Replica) -> None:
        url = replica.url
        self._users[url] = self._users.get(url, 0) + 1
        if self._users[url] > 1:
            return
        self._owner[url] = key
        if self.sink is None:
            self._pending.append((url, key, replica))
        else:
            self.sink.add_replica_page(url, key[0], key[1], replica.name)

    def _release(self, url: str) -> None:
        left = self._users.get(url, 0) - 1
        if left > 0:
            self._users[url] = left
            # The page stays, read for a pool that still names it.
            self._owner[url] = next(
                key
                for entries in (self._static, self._discovered)
                for key, replicas in entries.items()
                if any(r.url == url for r in replicas.values())
            )
            return
        self._users.pop(url, None)
        self._owner.pop(url, None)
        if self.sink is not None:
            self.sink.remove(url)


# An interest key nobody touches: waiting on it returns only when some other key becomes newly wanted.
_NEVER_TOUCHED = object()


def _name(replica: Replica) -> str:
    return replica.name
