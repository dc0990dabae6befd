"""List+watch caches that tell their owner about each object that changed, one at a time.

PodInformer follows pods (one namespace, or all with a label selector); ObjectInformer follows one
named object of a namespace (an InferencePool, a Service), present or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any, Generic, TypeVar

from keda_gpu_scaler.collect.backoff import backoff_delay, jittered
from keda_gpu_scaler.collect.supervise import supervised
from keda_gpu_scaler.core.errors import KubeError
from keda_gpu_scaler.kubernetes.api import Gone, KubeApi, NamedKind
from keda_gpu_scaler.kubernetes.pods import PodInfo, pod_info

log = logging.getLogger(__name__)

# The API server ends a watch after timeoutSeconds; informers in client-go pick 5-10 minutes at random
# so that many watches do not all reconnect at once.
WATCH_TIMEOUT_SECONDS = 300.0
FIRST_RETRY_SECONDS = 0.2
MAX_BACKOFF_SECONDS = 30.0
# A 410 Gone straight after a fresh list (a watch cache behind what the lists answer, e.g. an API server
# replica just restarted) is retried after this, doubling up to MAX_BACKOFF_SECONDS, as client-go's
# reflector does (0.8 s to 30 s): relisting at once would list the whole namespace thousands of times a
# second for as long as it lasts.
GONE_FIRST_RETRY_SECONDS = 0.8
# A watch that was accepted and then received an event (a bookmark counts) or stayed open this long was
# healthy: a failure after it is a first failure again (an idle cut by a load balancer), not one more in
# a row, so it is retried after FIRST_RETRY_SECONDS rather than after an ever longer wait.
HEALTHY_WATCH_SECONDS = 5.0
# A relist hands its differences to the owner in slices this big, with a turn of the event loop in
# between, so that listing thousands of pods never holds up the calls being answered.
RELIST_SLICE = 200

T = TypeVar("T")
# (previous state of the pod or None, new state or None); never both None, never equal.
PodHandler = Callable[[PodInfo | None, PodInfo | None], None]


def _resource_version(obj: Mapping[str, Any]) -> str | None:
    meta = obj.get("metadata") or {}
    version = meta.get("resourceVersion")
    return str(version) if version else None


class _Attempt:
    """One turn of the list-then-watch loop: when it started, when its watch was accepted, what it read."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_open: Callable[[], None]) -> None:
        self._loop = loop
        self._on_open = on_open
        self.started = loop.time()
        self.opened: float | None = None
        self.events = 0

    def open(self) -> None:
        self.opened = self._loop.time()
        self._on_open()

    def healthy(self) -> bool:
        """The watch was accepted and then read an event (a bookmark counts) or stayed open a while."""
        return self.opened is not None and (
            self.events > 0 or self._loop.time() - self.opened >= HEALTHY_WATCH_SECONDS
        )


class _ListWatch(Generic[T]):
    """The list-then-watch loop shared by the informers; subclasses say what to list, watch and keep.

    Lists, then watches from the list's resourceVersion with bookmarks; a 410 Gone relists (backing off
    when it comes straight after a list); other failures retry with a bounded backoff, counted afresh
    after a healthy watch. While the last attempt failed, `error` says why, and readers must not trust
    `items` (the API server may have moved on without us).
    """

    def __init__(
        self, api: KubeApi, on_restart: Callable[[str], None], on_status: Callable[[], None] | None = None
    ) -> None:
        self._api = api
        self._on_restart = on_restart
        # Called when `synced` or `error` changes (a first list, a failure, a recovery), for owners that
        # publish the informer's state rather than read it on demand.
        self._on_status = on_status
        self.items: dict[str, T] = {}
        self.synced = False
        self.error: str | None = None
        self._task: asyncio.Task[None] | None = None

    # --- what a subclass says -------------------------------------------------------------------------

    @property
    def what(self) -> str:
        raise NotImplementedError

    async def _list(self) -> dict[str, Any]:
        raise NotImplementedError

    def _watch(
        self, version: str, timeout: float, on_open: Callable[[], None]
    ) -> AsyncGenerator[dict[str, Any], None]:
        raise NotImplementedError

    def _read(self, obj: Mapping[str, Any]) -> T:
        raise NotImplementedError

    def _relisting(self, applying: bool) -> None:
        """A relist applied in several slices starts (True) and ends (False): in between, whatever the
        owner built from the changes is half way (a rollout's deletions are in, its additions not yet)."""

    def _key(self, item: T) -> str:
        raise NotImplementedError

    def _on_change(self, old: T | None, new: T | None) -> None:
        raise NotImplementedError

    # --- the loop -------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = supervised(self._run, f"informer {self.what}")

    def close(self) -> None:
        """Stop watching now (the task ends on the next turn of the loop); the cache is left as it was."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        version: str | None = None
        failures = 0  # failed attempts in a row, with no healthy watch in between
        gones = 0  # 410 Gone in a row, each straight after a fresh list
        while True:
            attempt = _Attempt(loop, on_open=lambda: self._set_error(None))
            listed = version is None
            try:
                if version is None:
                    version = await self._relist()
                async with contextlib.aclosing(
                    self._watch(version, WATCH_TIMEOUT_SECONDS * random.uniform(1.0, 2.0), attempt.open)
                ) as stream:
                    async for event in stream:
                        attempt.events += 1
                        version = self._apply(event) or version
            except Gone:
                log.info("%s: resourceVersion %s is too old (410 Gone): listing again", self.what, version)
                self._on_restart("gone")
                version = None
                if listed and not attempt.healthy():
                    # Not even the version a list just gave can be watched: listing again at once would
                    # list the whole lot again and again for as long as that lasts. Wait, longer each
                    # time in a row (the cache stays as the last list left it: current, with no error).
                    gones += 1
                    delay = backoff_delay(gones, first=GONE_FIRST_RETRY_SECONDS, cap=MAX_BACKOFF_SECONDS)
                    log.warning("%s: 410 Gone right after a list; listing again in %.1fs", self.what, delay)
                    await asyncio.sleep(jittered(delay, 0.2))
                else:  # the watch had moved on from its list (or was healthy): relist at once
                    gones = 0
                    if attempt.healthy():
                        failures = 0
                continue
            except KubeError as error:
                if attempt.healthy():  # a healthy watch that dropped: a first failure, not one more in a row
                    failures = gones = 0
                failures += 1
                self._set_error(self._describe(error))
                self._on_restart("error")
                delay = backoff_delay(failures, first=FIRST_RETRY_SECONDS, cap=MAX_BACKOFF_SECONDS)
                log.warning("%s: %s; retrying in %.1fs", self.what, error, delay)
                await asyncio.sleep(jittered(delay, 0.2))
                continue
            except Exception as error:
                # Anything else (an object this code cannot read) must not end the watcher silently and
                # leave a cache that looks current: report it (calls answer UNAVAILABLE) and list again.
                if attempt.healthy():
                    failures = gones = 0
                failures += 1
                self._set_error(f"unexpected error watching {self.what}: {error!r}")
                self._on_restart("error")
                log.exception("%s: unexpected error; listing again", self.what)
                version = None
                delay = backoff_delay(failures, first=FIRST_RETRY_SECONDS, cap=MAX_BACKOFF_SECONDS)
                await asyncio.sleep(jittered(delay, 0.2))
                continue
            # The server ended the watch. Reconnect at once, unless it keeps ending watches straight away.
            if attempt.events == 0 and loop.time() - attempt.started < 1.0:
                failures += 1
                await asyncio.sleep(
                    backoff_delay(failures, first=FIRST_RETRY_SECONDS, cap=MAX_BACKOFF_SECONDS)
                )
            else:
                failures = gones = 0

    def _describe(self, error: KubeError) -> str:
        return str(error)

    async def _relist(self) -> str:
        listing = await self._list()
        version = _resource_version(listing)
        if version is None:
            raise KubeError(f"the Kubernetes API listed {self.what} without a resourceVersion")
        fresh: dict[str, T] = {}
        for item in listing.get("items") or ():
            info = self._read(item)
            fresh[self._key(info)] = info
        del listing
        # Hand over only what differs from the cache, a slice at a time.
        changes: list[tuple[T | None, T | None]] = [
            (old, None) for key, old in self.items.items() if key not in fresh
        ]
        changes += [(self.items.get(key), new) for key, new in fresh.items() if self.items.get(key) != new]
        sliced = len(changes) > RELIST_SLICE
        if sliced:
            self._relisting(True)
        try:
            for start in range(0, len(changes), RELIST_SLICE):
                if start:
                    await asyncio.sleep(0)
                for old, new in changes[start : start + RELIST_SLICE]:
                    self._change(old, new)
        finally:
            if sliced:
                self._relisting(False)
        if not self.synced:
            self.synced = True
            self._status_changed()
        self._set_error(None)
        return version

    def _change(self, old: T | None, new: T | None) -> None:
        if new is not None:
            self.items[self._key(new)] = new
        elif old is not None:
            del self.items[self._key(old)]
        self._on_change(old, new)

    def _apply(self, event: Mapping[str, Any]) -> str | None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind in ("ADDED", "MODIFIED"):
            info = self._read(obj)
            old = self.items.get(self._key(info))
            if old != info:  # most MODIFIED events change nothing discovery reads (timestamps, probes)
                self._change(old, info)
        elif kind == "DELETED":
            info = self._read(obj)
            old = self.items.get(self._key(info))
            if old is not None:
                self._change(old, None)
        # BOOKMARK: nothing changed, but the resourceVersion moved on, so a reconnect resumes from there.
        return _resource_version(obj)

    def _set_error(self, error: str | None) -> None:
        if error != self.error:
            self.error = error
            self._status_changed()

    def _status_changed(self) -> None:
        if self._on_status is not None:
            self._on_status()


class PodInformer(_ListWatch[PodInfo]):
    """A list+watch cache of pods (one namespace, or all namespaces with a label selector).

    Every change of a pod is handed to `on_pod(old, new)` as it is applied (a relist hands over only its
    differences with the cache), so the owner keeps its own indexes current without ever rescanning.
    """

    def __init__(
        self,
        api: KubeApi,
        *,
        namespace: str | None,
        label_selector: str | None,
        on_pod: PodHandler,
        on_restart: Callable[[str], None] = lambda reason: None,
        on_status: Callable[[], None] | None = None,
        on_relist: Callable[[bool], None] = lambda applying: None,
    ) -> None:
        super().__init__(api, on_restart, on_status)
        self.namespace = namespace
        self.label_selector = label_selector
        self._on_pod = on_pod
        self._on_relist = on_relist

    def _relisting(self, applying: bool) -> None:
        self._on_relist(applying)

    @property
    def pods(self) -> dict[str, PodInfo]:
        """By "namespace/name"."""
        return self.items

    @property
    def what(self) -> str:
        where = f"namespace {self.namespace!r}" if self.namespace else "all namespaces"
        return f"pods in {where}" + (f" with labels {self.label_selector!r}" if self.label_selector else "")

    async def _list(self) -> dict[str, Any]:
        return await self._api.list_pods(self.namespace, self.label_selector)

    def _watch(
        self, version: str, timeout: float, on_open: Callable[[], None]
    ) -> AsyncGenerator[dict[str, Any], None]:
        return self._api.watch_pods(self.namespace, self.label_selector, version, timeout, on_open=on_open)

    def _read(self, obj: Mapping[str, Any]) -> PodInfo:
        return pod_info(obj)

    def _key(self, item: PodInfo) -> str:
        return item.key

    def _on_change(self, old: PodInfo | None, new: PodInfo | None) -> None:
        self._on_pod(old, new)


class ObjectInformer(_ListWatch[Mapping[str, Any]]):
    """Objects of one kind in one namespace (their name and spec): all of them, or the one called `name`
    (watched through a field selector, so the list and the watch carry only it).

    `on_object(name, spec)` is called whenever one appears or changes its spec, and with None when it
    goes. Only name and spec are kept: status and metadata change often and mean nothing here. A 404 to
    the list (the resource type is not served) is said in `error`.
    """

    def __init__(
        self,
        api: KubeApi,
        kind: NamedKind,
        namespace: str,
        on_object: Callable[[str, Mapping[str, Any] | None], None],
        *,
        name: str | None = None,
        on_restart: Callable[[str], None] = lambda reason: None,
        on_status: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(api, on_restart, on_status)
        self.kind = kind
        self.namespace = namespace
        self.name = name
        self._on_object = on_object

    def spec(self, name: str) -> Mapping[str, Any] | None:
        """The spec of the object called `name`, or None while it does not exist."""
        item = self.items.get(name)
        return None if item is None else item["spec"]

    @property
    def what(self) -> str:
        if self.name is None:
            return f"{self.kind.plural}.{self.kind.group or 'core'} in namespace {self.namespace!r}"
        api_version = f"{self.kind.group}/{self.kind.version}" if self.kind.group else self.kind.version
        return f"{self.kind.kind} {self.namespace}/{self.name} ({api_version})"

    async def _list(self) -> dict[str, Any]:
        return await self._api.list_named(self.kind, self.namespace, self.name)

    def _watch(
        self, version: str, timeout: float, on_open: Callable[[], None]
    ) -> AsyncGenerator[dict[str, Any], None]:
        return self._api.watch_named(self.kind, self.namespace, self.name, version, timeout, on_open=on_open)

    def _read(self, obj: Mapping[str, Any]) -> Mapping[str, Any]:
        meta = obj.get("metadata") or {}
        return {"name": meta.get("name") or "", "spec": obj.get("spec") or {}}

    def _key(self, item: Mapping[str, Any]) -> str:
        return str(item["name"])

    def _describe(self, error: KubeError) -> str:
        if error.status == 404:
            return (
                f"the Kubernetes API does not serve {self.kind.plural}.{self.kind.group or 'core'}"
                f" {self.kind.version} (is its CustomResourceDefinition installed?): {error}"
            )
        return str(error)

    def _on_change(self, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> None:
        item = new if new is not None else old
        assert item is not None
        if self.name is None or item["name"] == self.name:
            self._on_object(str(item["name"]), None if new is None else new["spec"])
