"""The gateway's pending requests at its page times: per replica, per trigger window, bounded, forgotten."""

from __future__ import annotations

import pytest

from keda_gpu_scaler.collect.gateway_source import ReplicaQueue
from keda_gpu_scaler.collect.pending_history import MAX_ASKED, PendingHistory
from keda_gpu_scaler.collect.store import Page
from keda_gpu_scaler.core.snapshot import SourceKind
from keda_gpu_scaler.demo.epp import Queued, epp_page
from keda_gpu_scaler.pages.gateways import page_queue

KEY = ("llm", "chat-pool", None)


def page(at: float, held: int, replica: str = "epp-0") -> Page:
    queue = ReplicaQueue("llm", "chat-pool", replica, page_queue(epp_page("chat-pool", {Queued("m"): held})))
    return Page.from_readings(f"url-{replica}", at, [queue])


def test_growth_is_per_replica_between_its_pages_and_each_window_keeps_its_own() -> None:
    history = PendingHistory(forget_after=600)
    history.want(KEY, 60, 0)
    history.want(KEY, 10, 0)
    for at, held in ((0, 0), (10, 60), (20, 60), (30, 60), (40, 60), (50, 60), (60, 60)):
        history.on_page(SourceKind.GATEWAY, page(at, held))
        history.on_page(SourceKind.GATEWAY, page(at + 5, 2 * held, "epp-1"))
    assert history.growth(KEY, ["epp-0"], 10, 60) == 0
    assert history.growth(KEY, ["epp-0"], 60, 60) == pytest.approx(1)
    assert history.growth(KEY, ["epp-0", "epp-1"], 60, 65) == pytest.approx(1 + 2)
    # A replica that is gone takes its points: no step in the pool's growth.
    history.on_removed(SourceKind.GATEWAY, page(65, 120, "epp-1"))
    assert history.growth(KEY, ["epp-0", "epp-1"], 60, 65) == pytest.approx(1)


def test_a_pool_nobody_asks_about_is_forgotten() -> None:
    history = PendingHistory(forget_after=100)
    history.want(KEY, 30, 0)
    for at in range(0, 400, 10):
        history.on_page(SourceKind.GATEWAY, page(at, at))
    assert len(history) == 0
    # Asked again: it starts from the newest page, one point.
    assert history.growth(KEY, ["epp-0"], 30, 400) == 0
    history.on_page(SourceKind.GATEWAY, page(400, 400))
    assert history.growth(KEY, ["epp-0"], 30, 400) == pytest.approx(1)


def test_pools_of_forgotten_triggers_go_as_others_are_asked_about_without_any_page() -> None:
    # They were swept only as gateway pages came: once their pages stopped, 30 models' pools stayed.
    history = PendingHistory(forget_after=100)
    for model in range(30):
        history.want(("llm", "chat-pool", f"m{model}"), 30, 0)
    history.want(("llm", "other-pool", None), 30, 500)
    assert len(history) == 1


def test_a_remembered_request_size_is_kept_per_prefill_weight() -> None:
    """Two triggers on one pool weighing prompt tokens differently (prefillWeight 0.25 and 4) size the same
    requests at 450 and 4,200 tokens: neither is handed the other's."""
    history = PendingHistory(forget_after=600)
    history.want(KEY, 30.0, 0.0)
    assert history.remember_size(KEY, 0.25, 450.0, 0.0) == 450.0
    assert history.remember_size(KEY, 4.0, None, 0.0) is None  # never measured at its own weight
    assert history.remember_size(KEY, 0.25, None, 0.0) == 450.0


def test_made_up_windows_and_prefill_weights_do_not_grow_a_pool_without_bound() -> None:
    """A caller sending a new prefillWeight (or window) on every call: each was kept for as long as the
    pool was read (1,000 weights, 1,000 sizes). The most recently asked MAX_ASKED stay, and one not asked
    for `forget_after` goes."""
    history = PendingHistory(forget_after=600)
    history.want(KEY, 30.0, 0.0)
    history.remember_size(KEY, 1.0, 450.0, 0.0)
    for i in range(1000):
        at = float(i)
        history.want(KEY, 30.0, at)
        history.remember_size(KEY, 1.0, None, at)  # the real trigger, asked for all along
        history.want(KEY, 10.0 + i / 1000, at)
        history.remember_size(KEY, 1.0 + (i + 1) / 10_000, 500.0, at)
    history.on_page(SourceKind.GATEWAY, page(1000.0, 0))
    pool = history._pools[KEY]
    assert len(pool.sizes) <= MAX_ASKED and len(pool.windows) <= MAX_ASKED
    assert history.remember_size(KEY, 1.0, None, 1000.0) == 450.0 and 30.0 in pool.windows
    history.want(KEY, 30.0, 1700.0)  # 700 s later: the made-up ones have not been asked for since 999
    assert history.remember_size(KEY, 1.0, None, 1700.0) == 450.0
    history.on_page(SourceKind.GATEWAY, page(1700.0, 0))
    assert set(pool.windows) == {30.0} and set(pool.sizes) == {1.0}


def test_replicas_that_leave_a_pools_prometheus_page_are_forgotten() -> None:
    """Through Prometheus one page holds every replica of a pool: 200 rollouts of its picker leave one."""
    history = PendingHistory(forget_after=600)
    at = 0.0
    for rollout in range(200):
        for _ in range(12):
            history.want(KEY, 30, at)
            queue = ReplicaQueue("llm", "chat-pool", f"epp-{rollout}", page_queue(epp_page("chat-pool", {})))
            history.on_page(SourceKind.PROMETHEUS_GATEWAY, Page.from_readings("prometheus:llm", at, [queue]))
            at += 5
    assert history.replicas_kept() == 1
