"""A list+watch cache of pods that tells its owner about each pod that changed, one at a time."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Mapping
from typing import Any

from keda_gpu_scaler.backoff import backoff_delay, jittered
from keda_gpu_scaler.discovery.api import Gone, KubeApi, KubeError
from keda_gpu_scaler.discovery.pods import PodInfo, pod_info
from keda_gpu_scaler.supervise import supervised

log = logging.getLogger(__name__)

# The API server ends a watch after timeoutSeconds; informers in client-go pick 5-10 minutes at random
# so that many watches do not all reconnect at once.
WATCH_TIMEOUT_SECONDS = 300.0
FIRST_RETRY_SECONDS = 0.2
MAX_BACKOFF_SECONDS = 30.0
# A relist hands its differences to the owner in slices this big, with a turn of the event loop in
# between, so that listing thousands of pods never holds up the calls being answered.
RELIST_SLICE = 200

# (previous state of the pod or None, new state or None); never both None, never equal.
PodHandler = Callable[[PodInfo | None, PodInfo | None], None]


def _resource_version(obj: Mapping[str, Any]) -> str | None:
    meta = obj.get("metadata") or {}
    version = meta.get("resourceVersion")
    return str(version) if version else None


class PodInformer:
    """A list+watch cache of pods (one namespace, or all namespaces with a label selector).

    Lists, then watches from the list's resourceVersion with bookmarks; a 410 Gone relists; other
    failures retry with a bounded backoff. Every change of a pod is handed to `on_pod(old, new)` as it is
    applied (a relist hands over only its differences with the cache), so the owner keeps its own
    indexes current without ever rescanning. While the last attempt failed, `error` says why, and
    readers must not trust `pods` (the API server may have moved on without us).
    """

    def __init__(
        self,
        api: KubeApi,
        *,
        namespace: str | None,
        label_selector: str | None,
        on_pod: PodHandler,
        on_restart: Callable[[str], None] = lambda reason: None,
    ) -> None:
        self._api = api
        self.namespace = namespace
        self.label_selector = label_selector
        self._on_pod = on_pod
        self._on_restart = on_restart
        self.pods: dict[str, PodInfo] = {}  # by "namespace/name"
        self.synced = False
        self.error: str | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def what(self) -> str:
        where = f"namespace {self.namespace!r}" if self.namespace else "all namespaces"
        return f"pods in {where}" + (f" with labels {self.label_selector!r}" if self.label_selector else "")

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
        failures = 0
        while True:
            started = loop.time()
            events = 0
            try:
                if version is None:
                    version = await self._relist()
                async with contextlib.aclosing(
                    self._api.watch_pods(
                        self.namespace,
                        self.label_selector,
                        version,
                        WATCH_TIMEOUT_SECONDS * random.uniform(1.0, 2.0),
                        on_open=lambda: self._set_error(None),
                    )
                ) as stream:
                    async for event in stream:
                        events += 1
                        version = self._apply(event) or version
            except Gone:
                log.info("%s: resourceVersion %s is too old (410 Gone): listing again", self.what, version)
                self._on_restart("gone")
                version = None
                continue
            except KubeError as error:
                failures += 1
                self._set_error(str(error))
                self._on_restart("error")
                delay = backoff_delay(failures, first=FIRST_RETRY_SECONDS, cap=MAX_BACKOFF_SECONDS)
                log.warning("%s: %s; retrying in %.1fs", self.what, error, delay)
                await asyncio.sleep(jittered(delay, 0.2))
                continue
            except Exception as error:
                # Anything else (an object this code cannot read) must not end the watcher silently and
                # leave a cache that looks current: report it (calls answer UNAVAILABLE) and list again.
                failures += 1
                self._set_error(f"unexpected error watching {self.what}: {error!r}")
                self._on_restart("error")
                log.exception("%s: unexpected error; listing again", self.what)
                version = None
                delay = backoff_delay(failures, first=FIRST_RETRY_SECONDS, cap=MAX_BACKOFF_SECONDS)
                await asyncio.sleep(jittered(delay, 0.2))
                continue
            # The server ended the watch. Reconnect at once, unless it keeps ending watches straight away.
            if events == 0 and loop.time() - started < 1.0:
                failures += 1
                await asyncio.sleep(
                    backoff_delay(failures, first=FIRST_RETRY_SECONDS, cap=MAX_BACKOFF_SECONDS)
                )
            else:
                failures = 0

    async def _relist(self) -> str:
        listing = await self._api.list_pods(self.namespace, self.label_selector)
        version = _resource_version(listing)
        if version is None:
            raise KubeError(f"the Kubernetes API listed {self.what} without a resourceVersion")
        fresh: dict[str, PodInfo] = {}
        for item in listing.get("items") or ():
            info = pod_info(item)
            fresh[info.key] = info
        del listing
        # Hand over only what differs from the cache, a slice at a time.
        changes: list[tuple[PodInfo | None, PodInfo | None]] = [
            (old, None) for key, old in self.pods.items() if key not in fresh
        ]
        changes += [(self.pods.get(key), new) for key, new in fresh.items() if self.pods.get(key) != new]
        for start in range(0, len(changes), RELIST_SLICE):
            if start:
                await asyncio.sleep(0)
            for old, new in changes[start : start + RELIST_SLICE]:
                self._change(old, new)
        self.synced = True
        self._set_error(None)
        return version

    def _change(self, old: PodInfo | None, new: PodInfo | None) -> None:
        if new is not None:
            self.pods[new.key] = new
        elif old is not None:
            del self.pods[old.key]
        self._on_pod(old, new)

    def _apply(self, event: Mapping[str, Any]) -> str | None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind in ("ADDED", "MODIFIED"):
            info = pod_info(obj)
            old = self.pods.get(info.key)
            if old != info:  # most MODIFIED events change nothing discovery reads (timestamps, probes)
                self._change(old, info)
        elif kind == "DELETED":
            info = pod_info(obj)
            old = self.pods.get(info.key)
            if old is not None:
                self._change(old, None)
        # BOOKMARK: nothing changed, but the resourceVersion moved on, so a reconnect resumes from there.
        return _resource_version(obj)

    def _set_error(self, error: str | None) -> None:
        self.error = error
