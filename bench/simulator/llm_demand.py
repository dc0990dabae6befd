"""The demand signal of SPEC §6 and the target/missing/starting-pod rule of SPEC §4, as the scaler computes
them from its own scrapes. The simulator's own copy, one function each, until the product's lands."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

from bench.simulator.llm_signals import Page, View


def spec4_value(total: float, fresh: int, missing: int, starting: int, threshold: float) -> float | None:
    """SPEC §4 over the target pods: S = `total` over the `fresh` Ready pods; u = S / (fresh × T).
    u > 1: max(S, N × T); u ≤ 1: S + (M + U) × T. None: UNAVAILABLE (fewer than half of the Ready pods
    fresh, or no Ready pod while some are starting)."""
    ready = fresh + missing
    if ready == 0:
        return None if starting else total  # scaled to zero: only what is added beside the pods (pending)
    if 2 * fresh < ready:
        return None
    pods = ready + starting
    if total > fresh * threshold:
        return max(total, pods * threshold)
    return total + (missing + starting) * threshold


def _inflight(page: Page) -> int:
    return page.running + page.waiting


def _work(page: Page, weight: float | None) -> float:
    """What a pod's counters say it has taken on: requests finished, or their weighted tokens."""
    if weight is None:
        return float(page.finished)
    return weight * page.prompt_tokens + page.generation_tokens


def pod_rates(
    scrapes: Sequence[View] | deque[View], window: float, weight: float | None = None
) -> dict[str, float | None]:
    """λ per Ready pod of the newest scrape: (Δ finished + Δ (running + waiting)) / the span, against the
    newest scrape at least `window` older (or the pod's oldest, when it is younger). With `weight`, in
    tokens: Δ (prompt tokens × weight + generation tokens), plus the in-flight change at the window's
    tokens per finished request. None: one sample only (no rate yet)."""
    if not scrapes:
        return {}
    now = scrapes[-1]
    rates: dict[str, float | None] = {}
    for pod, page in now.pages.items():
        then: View | None = None
        for view in scrapes:  # oldest first: the newest one at least a window old, else the pod's oldest
            if view is now:
                break
            if pod in view.pages:
                if then is None or view.at <= now.at - window:
                    then = view
                if view.at > now.at - window:
                    break
        if then is None:
            rates[pod] = None
            continue
        before, span = then.pages[pod], now.at - then.at
        done = _work(page, weight) - _work(before, weight)
        queued = _inflight(page) - _inflight(before)
        if weight is not None:
            finished = page.finished - before.finished
            size = done / finished if finished > 0 else _lifetime_size(page, weight)
            queued_work = queued * size
        else:
            queued_work = float(queued)
        rates[pod] = max(0.0, (done + queued_work) / span)
    return rates


def _lifetime_size(page: Page, weight: float) -> float:
    return _work(page, weight) / page.finished if page.finished else 0.0


def demand_total(rates: dict[str, float | None]) -> float | None:
    """Σ λ over the Ready pods; a pod without a rate counts as the mean of the others. None: none has one."""
    known = [r for r in rates.values() if r is not None]
    if not known:
        return None if rates else 0.0
    mean = math.fsum(known) / len(known)
    return math.fsum(mean if r is None else r for r in rates.values())


def pending_rate(history: Sequence[tuple[float, int]] | deque[tuple[float, int]], window: float) -> float:
    """The gateway's pending requests as demand (SPEC §6 with inferencePool): their growth over the window
    plus enough to clear them within one window."""
    if not history:
        return 0.0
    at, now = history[-1]
    then_at, then = history[0]
    for t, value in history:
        if t <= at - window:
            then_at, then = t, value
        else:
            break
    growth = (now - then) / (at - then_at) if at > then_at else 0.0
    return max(0.0, growth + now / window)
