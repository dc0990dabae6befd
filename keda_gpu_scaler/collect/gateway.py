"""Gateway pages (SPEC §7): which endpoint-picker (EPP) replica pages are scraped for which InferencePool.

The queue that wakes a workload from zero lives in the inference gateway's endpoint picker, not in any
pod of the target. One InferencePool has one or more EPP replicas (active-active: each keeps its own
queue), and each replica serves one metrics page. GatewayPages is the one place that knows, per wanted
pool and metrics port (wanted.EppPool, wanted by `pending` triggers' subscriptions), which replica
pages it has and why there are none; each pool wants its pages (wanted.EppPage) in the registry of
wanted sources, which hands them to the gateway collector.

Who feeds it:
- Kubernetes discovery: for every pool in `pools()`, InferencePool → `endpointPickerRef` Service → its
  Ready pods → `set_replicas(pool, {pod name: metrics URL}, {pod name: why it cannot be reached})`, or
  `set_problem(pool, message)` when there is no replica to read (the pool does not exist yet, its
  endpointPickerRef is not a Service, no Ready EPP pod). Call again on every change; calls that change
  nothing cost nothing. `forget(pool)` when it is no longer followed.
- `--gateway-url NAMESPACE/POOL=URL` (no Kubernetes): `add_static()` once per flag at start-up; read
  while some trigger wants the pool, at whatever port.

Who reads it: the `pending` evaluation (`replicas()`, `unreachable()`, `problem()`), which never adds or
removes anything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from keda_gpu_scaler.collect.wanted import EppPage, EppPool, PageBindings, WantedSources, one_namespace

PoolKey = tuple[str, str]
"""(namespace, InferencePool name)."""


class GatewaySink(Protocol):
    """Where replica pages go: the gateway scrape collector (one store source per replica page)."""

    def add_page(self, page: EppPage) -> None: ...

    def remove(self, url: str) -> None: ...


@dataclass(frozen=True, slots=True)
class Replica:
    """One EPP replica page of a pool: `name` is the EPP pod (the URL itself for a --gateway-url)."""

    name: str
    url: str
    static: bool


class GatewayPages:
    """Per wanted (namespace, pool, port): its EPP replica pages, or why there are none (see the module
    docstring). `start(sink)` hands it the collector; from then on the pages wanted are scraped."""

    def __init__(self, wanted: WantedSources) -> None:
        self._wanted = wanted
        self._static: dict[PoolKey, dict[str, Replica]] = {}
        self._discovered: dict[EppPool, dict[str, Replica]] = {}
        # Ready replicas discovery cannot reach (pod name → why): replicas that cannot be read.
        self._unreachable: dict[EppPool, dict[str, str]] = {}
        self._problems: dict[EppPool, str] = {}
        self._absent: set[EppPool] = set()  # pools discovery found not to exist (their problem says so)
        self._bindings: PageBindings[EppPage] | None = None
        self.on_pools: Callable[[], None] = lambda: None  # discovery: the wanted pools changed

    def start(self, sink: GatewaySink) -> None:
        """Scrape the pages wanted from now on (and those wanted so far) through `sink`."""
        self._bindings = PageBindings(sink.add_page, sink.remove, one_namespace)
        self._wanted.handle(EppPage, self._bindings.added, self._bindings.removed)
        self._wanted.handle(EppPool, self._pool_wanted, self._pool_unwanted)

    # -- what is wanted ------------------------------------------------------------------------------

    def pools(self) -> list[EppPool]:
        """The pools (at their ports) some followed `pending` trigger reads now."""
        return self._wanted.of_kind(EppPool)

    def _pool_wanted(self, pool: EppPool) -> None:
        self._want_static(pool)
        self.on_pools()

    def _pool_unwanted(self, pool: EppPool) -> None:
        self._wanted.release(("static", pool))
        self.forget(pool)
        self.on_pools()

    def _want_static(self, pool: EppPool) -> None:
        replicas = self._static.get((pool.namespace, pool.pool), {})
        self._wanted.want(("static", pool), (_page(pool, r) for r in replicas.values()))

    # -- the Kubernetes side and the static flag -----------------------------------------------------

    def set_replicas(
        self, pool: EppPool, replicas: Mapping[str, str], unreachable: Mapping[str, str] | None = None
    ) -> None:
        self._problems.pop(pool, None)
        self._absent.discard(pool)
        if not self._wanted.wanted(pool):
            replicas = unreachable = {}  # a late word about a pool no longer wanted: nothing of it is kept
        new = {name: Replica(name, url, static=False) for name, url in replicas.items()}
        if new:
            self._discovered[pool] = new
        else:
            self._discovered.pop(pool, None)
        if unreachable:
            self._unreachable[pool] = dict(unreachable)
        else:
            self._unreachable.pop(pool, None)
        self._wanted.want(("discovered", pool), (_page(pool, r) for r in new.values()))

    def set_problem(self, pool: EppPool, message: str, *, absent: bool = False) -> None:
        self.set_replicas(pool, {})
        self._problems[pool] = message
        if absent:
            self._absent.add(pool)

    def forget(self, pool: EppPool) -> None:
        self.set_replicas(pool, {})
        self._problems.pop(pool, None)

    def add_static(self, namespace: str, pool: str, url: str) -> None:
        replicas = self._static.setdefault((namespace, pool), {})
        if url in replicas:
            return
        replicas[url] = Replica(url, url, static=True)
        for wanted in self.pools():
            if (wanted.namespace, wanted.pool) == (namespace, pool):
                self._want_static(wanted)

    # -- the read side -------------------------------------------------------------------------------

    def replicas(self, pool: EppPool) -> tuple[Replica, ...]:
        """The pool's replica pages (static first, then discovered, each by name); empty when none.

        A URL named by two pools of one namespace (a repeated --gateway-url) belongs to the first that
        wanted it: its page is read for that pool only, and the other pool does not list it. One named by
        pools of two namespaces is read for neither (wanted.one_namespace)."""
        return tuple(r for r in self._named(pool) if self._bound_to(r.url) == (pool.namespace, pool.pool))

    def unreachable(self, pool: EppPool) -> Mapping[str, str]:
        """The pool's Ready replicas discovery cannot reach on their metrics port (pod name → why): each
        is a replica that cannot be read, as one whose page fails."""
        return self._unreachable.get(pool, {})

    def read_elsewhere(self, pool: EppPool) -> Mapping[str, str]:
        """The pool's replicas whose page is not read for it (name → why): its address is filed under
        another pool, or under none while two namespaces name it. Each is a replica that cannot be read,
        never one left out: it may hold the pool's every queued request (SPEC §7)."""
        if self._bindings is None:
            return {}
        return {
            replica.name: self._why_elsewhere(pool, replica)
            for replica in self._named(pool)
            if self._bound_to(replica.url) != (pool.namespace, pool.pool)
        }

    def problem(self, pool: EppPool) -> str | None:
        """Why the pool has no replica page to read, where that is known: discovery's word, else the
        addresses that another namespace's pool names too."""
        if (problem := self._problems.get(pool)) is not None or self._bindings is None:
            return problem
        shared = (self._why_elsewhere(pool, r) for r in self._named(pool) if self._other_namespaces(pool, r))
        return next(shared, None)

    def _other_namespaces(self, pool: EppPool, replica: Replica) -> set[str]:
        assert self._bindings is not None
        return {claim.namespace for claim in self._bindings.claims(replica.url)} - {pool.namespace}

    def _why_elsewhere(self, pool: EppPool, replica: Replica) -> str:
        others = self._other_namespaces(pool, replica)
        where = f"the endpoint-picker address {replica.url} of InferencePool {pool.namespace}/{pool.pool}"
        if others:
            return (
                f"{where} is also named by a pool of namespace {', '.join(sorted(others))}: it is read for"
                " neither until one of them goes (a pod IP reused while a watch catches up), so no namespace's"
                " token reaches another's pod"
            )
        owner = self._bound_to(replica.url)
        if owner is None:
            return f"{where} is not read yet"
        return f"{where} is read for InferencePool {owner[0]}/{owner[1]}, which names it too"

    def _named(self, pool: EppPool) -> list[Replica]:
        return [
            *self._static.get((pool.namespace, pool.pool), {}).values(),
            *sorted(self._discovered.get(pool, {}).values(), key=_name),
        ]

    def unknown_pool(self, pool: EppPool, discovering: bool) -> str | None:
        """Why no InferencePool of that name exists, naming those that do; None when it exists (with or
        without pods). A pool name that matches no pool is a trigger's typo, never "nothing pending".
        Discovery says which pools exist; without it, the --gateway-url flags do."""
        if pool in self._absent:
            return self._problems[pool]
        managed = pool in self._problems or pool in self._discovered  # discovery speaks of it
        if discovering or managed or (pool.namespace, pool.pool) in self._static:
            return None
        known = sorted(name for namespace, name in self._static if namespace == pool.namespace)
        return (
            f"InferencePool {pool.namespace}/{pool.pool} is not configured: no --gateway-url names it"
            f" (the pools configured in namespace {pool.namespace!r}: {', '.join(known) or 'none'});"
            f" give --gateway-url {pool.namespace}/{pool.pool}=URL, one per endpoint-picker replica"
        )

    def _bound_to(self, url: str) -> PoolKey | None:
        page = self._bindings.bound(url) if self._bindings is not None else None
        return None if page is None else (page.namespace, page.pool)


def _page(pool: EppPool, replica: Replica) -> EppPage:
    return EppPage(replica.url, pool.namespace, pool.pool, replica.name)


def _name(replica: Replica) -> str:
    return replica.name
