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
    "unchanged-page digest": "a page's readings when its next page is the same bytes (`scrape.digest_and_read`)",
}
# Process settings of `serve` (app.run_until_signalled), switched the same way.
POLICIES: dict[str, str] = {
    "gc: no freeze at start-up": "`gc.freeze()` after start-up (app.run_until_signalled) does nothing",
}


def _unchanged_page_digest() -> list[tuple[Any, str, Any]]:
    from keda_gpu_scaler.collect import scrape

    read = scrape.digest_and_read

    def whole(body: bytes, previous: Any, reader: Any, digest: bytes | None = None) -> Any:
        return read(body, None, reader, digest)

    return [(scrape, "digest_and_read", whole)]


def _no_freeze() -> list[tuple[Any, str, Any]]:
    import gc

    def freeze() -> None:
        pass

    return [(gc, "freeze", freeze)]


_PATCHES: dict[str, Callable[[], list[tuple[Any, str, Any]]]] = {
    "unchanged-page digest": _unchanged_page_digest,
    "gc: no freeze at start-up": _no_freeze,
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
