"""What is collected: the wanted sources of every followed trigger, counted in one place that collectors read.

Each owner (a trigger's subscription; an exporter node; an InferencePool's EPP replicas at one port)
says which sources it wants now, replacing what it wanted before. A source is wanted while at least
one owner wants it, and is then fetched once however many want it. Each kind of source has one
handler, told when a source of its kind becomes wanted and when it stops being wanted: collectors
start and stop fetching, discovery starts and stops watching. A trigger's own settings (a port, a
path) are part of its sources, so one trigger's typo never changes what another reads.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar
from urllib.parse import urlsplit


@dataclass(frozen=True, slots=True)
class ExporterPage:
    """A GPU exporter's page (a node's exporter, or an --exporter-url)."""

    url: str


@dataclass(frozen=True, slots=True)
class ExporterNode:
    """A node some target pod runs on: its GPU exporters' pages are wanted (discovery finds them)."""

    node: str


@dataclass(frozen=True, slots=True)
class PodPage:
    """An inference server's own page, filed under the pod that serves it."""

    url: str
    namespace: str
    pod: str
    declared: bool = True  # the pod declares the page's port as a container port (it owns that address)


def owning_pod(claims: list[PodPage]) -> PodPage | None:
    """Which pod the pages at one address are filed under: the one pod named for them, else the one among
    several that declares its port. Pod IPs are shared (hostNetwork pods share their node's) and reused
    (across namespaces too): when none or several declare it, the address is read for nobody until a claim
    goes — never for whoever named it last, which would let a tenant naming another's port read that load."""
    if len({(c.namespace, c.pod) for c in claims}) > 1:
        claims = [c for c in claims if c.declared]
    return claims[0] if len({(c.namespace, c.pod) for c in claims}) == 1 else None


@dataclass(frozen=True, slots=True)
class EppPool:
    """An InferencePool's endpoint pickers, read at one metrics port (`gatewayMetricsPort`)."""

    namespace: str
    pool: str
    port: int


@dataclass(frozen=True, slots=True)
class EppPage:
    """One endpoint-picker replica's page, filed under its pool."""

    url: str
    namespace: str
    pool: str
    replica: str


def one_namespace(claims: list[EppPage]) -> EppPage | None:
    """Which pool a picker page at one URL is filed under: the first that named it, while every claim is of
    one namespace. Pod IPs are reused across namespaces, and a watch that is relisting keeps its last pods:
    when two namespaces' pools name one address it is read for neither until a claim goes — never with the
    first namespace's token sent to what may now be another tenant's pod, read as its queue."""
    return claims[0] if len({claim.namespace for claim in claims}) == 1 else None


@dataclass(frozen=True, slots=True)
class PrometheusQuery:
    """A namespace's series in Prometheus: `what` is gpu, inference or gateway (with its pool)."""

    what: str
    namespace: str
    pool: str | None = None


S = TypeVar("S")
# A kind's handler: told when a source of it becomes wanted, and when nobody wants it any more.
_Handler = tuple[Callable[[Any], None], Callable[[Any], None]]


class WantedSources:
    """Every wanted source with the number of owners wanting it, and each owner's sources.

    Read by collectors (`wanted`, `wait_until_wanted`, `of_kind`) and by the handlers each kind has;
    written only by owners (`want`, `release`). A source of a kind with no handler is only counted.
    """

    def __init__(self) -> None:
        self._by_owner: dict[Hashable, frozenset[Hashable]] = {}
        self._count: dict[Hashable, int] = {}
        self._handlers: dict[type, _Handler] = {}
        self._woken = asyncio.Event()

    def handle(self, kind: type[S], added: Callable[[S], None], removed: Callable[[S], None]) -> None:
        """Set the handler of a kind; the sources of that kind wanted already are handed to it now."""
        self._handlers[kind] = (added, removed)
        for source in [s for s in self._count if type(s) is kind]:
            added(source)

    def want(self, owner: Hashable, sources: Iterable[Hashable]) -> None:
        """`owner` wants exactly these sources now (none: it is released)."""
        new = frozenset(sources)
        before = self._by_owner.get(owner, frozenset())
        if new == before:
            return
        if new:
            self._by_owner[owner] = new
        else:
            self._by_owner.pop(owner, None)
        # Releases first: an address another pod now has is given up before the new pod's page takes it.
        for source in before - new:
            self._unref(source)
        for source in new - before:
            self._ref(source)

    def release(self, owner: Hashable) -> None:
        self.want(owner, ())

    def wanted(self, source: Hashable) -> bool:
        return source in self._count

    def of_owner(self, owner: Hashable) -> frozenset[Hashable]:
        return self._by_owner.get(owner, frozenset())

    def of_kind(self, kind: type[S]) -> list[S]:
        return [s for s in self._count if type(s) is kind]

    def __len__(self) -> int:
        return len(self._count)

    async def wait_until_wanted(self, timeout: float, key: Hashable) -> None:
        """Return once `key` is wanted, when any source becomes newly wanted, or after `timeout`."""
        if self.wanted(key):
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._woken.wait(), timeout)

    def _ref(self, source: Hashable) -> None:
        count = self._count.get(source, 0) + 1
        self._count[source] = count
        if count > 1:
            return
        woken, self._woken = self._woken, asyncio.Event()
        woken.set()
        handler = self._handlers.get(type(source))
        if handler is not None:
            handler[0](source)

    def _unref(self, source: Hashable) -> None:
        count = self._count[source] - 1
        if count > 0:
            self._count[source] = count
            return
        del self._count[source]
        handler = self._handlers.get(type(source))
        if handler is not None:
            handler[1](source)


class _Page(Protocol, Hashable):
    @property
    def url(self) -> str: ...


P = TypeVar("P", bound=_Page)


def _itself(value: Hashable) -> Hashable:
    return value


class PageBindings(Generic[P]):
    """One fetch per URL although several wanted sources may name it (a pod IP reused, a repeated flag).

    The claims on the URLs of one `address` (by default each URL is an address of its own) are decided
    together: `choose` says which of them wins (None: none for now); by default the first that named one,
    and when that one is no longer wanted, the next. Each URL there is filed under its first claim of the
    winner's `owner` (by default the winning claim itself), and the others under none. Never under two:
    one page is never read as two pods' or pools'.
    """

    def __init__(
        self,
        bind: Callable[[P], None],
        unbind: Callable[[str], None],
        choose: Callable[[list[P]], P | None] = lambda claims: claims[0],
        *,
        address: Callable[[str], Hashable] = _itself,
        owner: Callable[[P], Hashable] = _itself,
    ) -> None:
        self._bind: Callable[[P], None] = bind
        self._unbind: Callable[[str], None] = unbind
        self._choose = choose
        self._address = address
        self._owner = owner
        self._claims: dict[str, list[P]] = {}
        self._at: dict[Hashable, dict[str, None]] = {}  # each address's URLs with claims, in order
        self._bound: dict[str, P] = {}

    def added(self, source: P) -> None:
        self._claims.setdefault(source.url, []).append(source)
        self._at.setdefault(self._address(source.url), {})[source.url] = None
        self._settle(source.url)

    def removed(self, source: P) -> None:
        claims = self._claims.get(source.url)
        if claims is None or source not in claims:
            return
        claims.remove(source)
        if not claims:
            del self._claims[source.url]
            address = self._address(source.url)
            urls = self._at[address]
            del urls[source.url]
            if not urls:
                del self._at[address]
        self._settle(source.url)

    def claims(self, url: str) -> tuple[P, ...]:
        """Every wanted source that names `url` now."""
        return tuple(self._claims.get(url, ()))

    def bound(self, url: str) -> P | None:
        """The source the page at `url` is filed under (None: it is not fetched)."""
        return self._bound.get(url)

    def _settle(self, changed: str) -> None:
        """Files every URL at the address of `changed` (which may have no claim left) anew."""
        urls = self._at.get(self._address(changed), {})
        claims = [claim for url in urls for claim in self._claims[url]]
        winner = self._choose(claims) if claims else None
        for url in [*urls, *([] if changed in urls else [changed])]:
            chosen = None
            if winner is not None:
                owner = self._owner(winner)
                chosen = next((c for c in self._claims.get(url, ()) if self._owner(c) == owner), None)
            bound = self._bound.get(url)
            if chosen == bound:
                continue
            if bound is not None:
                # Never left filed under the source that had it: its address may be another pod's now.
                del self._bound[url]
                self._unbind(url)
            if chosen is not None:
                self._bound[url] = chosen
                self._bind(chosen)


def server_address(url: str) -> tuple[str, str]:
    """Where a URL's server listens: its scheme, host and port."""
    parts = urlsplit(url)
    return parts.scheme, parts.netloc


def _pod_of(page: PodPage) -> tuple[str, str]:
    return page.namespace, page.pod


def pod_page_bindings(
    bind: Callable[[PodPage], None], unbind: Callable[[str], None], *, pod_ips: bool
) -> PageBindings[PodPage]:
    """The bindings of pod pages. At pod IPs (Kubernetes) every page at one address (IP and port) is filed
    under the pod that owns the address, at whatever path it names: the server there answers any path it
    likes (vLLM serves its page at every path starting with /metrics), so another pod naming another path
    there would read the same page. The operator's --inference-url pages are each a page of its own."""
    if pod_ips:
        return PageBindings(bind, unbind, owning_pod, address=server_address, owner=_pod_of)
    return PageBindings(bind, unbind, owning_pod)
