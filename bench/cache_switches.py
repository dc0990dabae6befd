"""The caches benchmark's switches: each replaces one cache (or process policy) of the scaler with the simple
version by monkeypatching, so the product carries no on/off flag of its own.

Used by bench/gcprobe/sitecustomize.py (BENCH_CACHES_OFF, in a `serve` started by bench/bench_caches.py),
by that benchmark's per-operation timings, and by tests/unit/test_cached_paths.py, which checks that each
cached path answers what its simple version answers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

# name → what the cache keeps (the table in docs/BENCHMARKS.md, "Caches")
SWITCHES: dict[str, str] = {
    "store views": "one namespace's view of the store, shared by its ScaledObjects (`Store._views`)",
    "store freshness": "which node exporters are fresh, worked out once for every namespace (`Store._freshness_of`)",
    "unchanged-page digest": "a page's readings when its next page is the same bytes (`scrape._digest_and_read`)",
    "trigger parse cache": "the parsed TriggerSpec of each metadata map (`trigger._parse_cached`, lru_cache)",
}
# Process policies of `serve` (app.run_until_signalled), switched the same way.
POLICIES: dict[str, str] = {
    "gc: freeze after start-up only": "no freeze after every full collection (`gcpolicy`), one `gc.freeze()` at start-up",
    "gil: default switch interval": "`sys.setswitchinterval` left at Python's 5 ms instead of 1 ms",
}


def _store_views() -> list[tuple[Any, str, Any]]:
    from keda_gpu_scaler.collect.store import SourceKind, Store

    def view(
        self: Store, namespace: str, now: float, max_staleness: float, kind: SourceKind = SourceKind.SCRAPE
    ) -> Any:
        return self._view(namespace, now, max_staleness, kind)

    return [(Store, "view", view)]


def _store_freshness() -> list[tuple[Any, str, Any]]:
    from keda_gpu_scaler.collect.store import Store

    return [(Store, "_anywhere", Store._walk_anywhere)]


def _unchanged_page_digest() -> list[tuple[Any, str, Any]]:
    from keda_gpu_scaler.collect import scrape

    read = scrape._digest_and_read

    def whole(body: bytes, previous: Any, reader: Any, digest: bytes | None = None) -> Any:
        return read(body, None, reader, digest)

    return [(scrape, "_digest_and_read", whole)]


def _trigger_parse_cache() -> list[tuple[Any, str, Any]]:
    from keda_gpu_scaler import trigger

    return [(trigger, "_parse_cached", trigger._parse_cached.__wrapped__)]


def _freeze_once() -> list[tuple[Any, str, Any]]:
    from keda_gpu_scaler import app

    class StartupFreezeOnly:
        def install(self) -> None:
            pass

        def remove(self) -> None:
            pass

    return [(app, "FreezeAfterFullCollections", StartupFreezeOnly)]


def _default_switch_interval() -> list[tuple[Any, str, Any]]:
    from keda_gpu_scaler import app

    return [(app, "GIL_SWITCH_INTERVAL", 0.005)]  # Python's own default


_PATCHES: dict[str, Callable[[], list[tuple[Any, str, Any]]]] = {
    "store views": _store_views,
    "store freshness": _store_freshness,
    "unchanged-page digest": _unchanged_page_digest,
    "trigger parse cache": _trigger_parse_cache,
    "gc: freeze after start-up only": _freeze_once,
    "gil: default switch interval": _default_switch_interval,
}


def switch_off(names: list[str]) -> None:
    """Replace each named cache or policy with its simple version, for the rest of the process."""
    for name in names:
        if name not in _PATCHES:
            raise SystemExit(f"bench caches: {name!r} is not one of {sorted(_PATCHES)}")
        for owner, attribute, simple in _PATCHES[name]():
            setattr(owner, attribute, simple)


@contextlib.contextmanager
def switched_off(*names: str) -> Iterator[None]:
    """switch_off(names) until the block ends (tests and per-operation timings in one process)."""
    patches = [patch for name in names for patch in _PATCHES[name]()]
    saved = [(owner, attribute, getattr(owner, attribute)) for owner, attribute, _ in patches]
    try:
        for owner, attribute, simple in patches:
            setattr(owner, attribute, simple)
        yield
    finally:
        for owner, attribute, value in reversed(saved):
            setattr(owner, attribute, value)
