"""Table tests for demand.pod_demand, over_window and pending_demand: points → exact rates."""

from __future__ import annotations

import math

import pytest

from keda_gpu_scaler.core.demand import (
    DemandPoint,
    DemandUnit,
    growth_per_second,
    over_window,
    pending_demand,
    pod_demand,
)
from keda_gpu_scaler.pages.engines import Missing, MissingKind


def p(
    at: float, finished: float, flight: float, prompt: float | None = None, gen: float | None = None
) -> DemandPoint:
    return DemandPoint(at, finished, flight, prompt, gen)


CASES = [
    # (points, expected requests per second)
    pytest.param([p(0, 100, 10), p(60, 700, 10)], 10.0, id="steady: finished only"),
    pytest.param(
        [p(0, 100, 10), p(30, 400, 40), p(60, 700, 70)], 11.0, id="a backlog builds: it arrived too"
    ),
    pytest.param([p(0, 100, 70), p(60, 760, 10)], 10.0, id="a backlog drains: it arrived before"),
    pytest.param(
        [p(0, 500, 5), p(30, 800, 5), p(40, 50, 3), p(60, 250, 3)], (300 + 53 + 200) / 60, id="restart"
    ),
    pytest.param([p(0, 500, 5), p(60, 500, 5)], 0.0, id="idle"),
    # Requests lost at a restart never finish: what arrived cannot be below none.
    pytest.param([p(0, 500, 40), p(60, 500, 0)], 0.0, id="lost requests: never negative"),
    pytest.param([p(0, 0, 0), p(5, 0, 0), p(10, 10, 0)], 1.0, id="uneven spacing over the span"),
]


@pytest.mark.parametrize(("points", "expected"), CASES)
def test_requests_per_second(points: list[DemandPoint], expected: float) -> None:
    assert pod_demand(points) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("points", "why"),
    [
        pytest.param([], "no page", id="no point"),
        pytest.param([p(3, 100, 1)], "one page", id="one sample"),
        pytest.param([p(3, 100, 1), p(3, 100, 1)], "one instant", id="same instant"),
    ],
)
def test_no_rate_yet(points: list[DemandPoint], why: str) -> None:
    rate = pod_demand(points)
    assert isinstance(rate, Missing)
    assert rate.kind is MissingKind.NO_RATE
    assert why in rate.reason


def test_tokens_weigh_each_request_by_its_size() -> None:
    # 10 req/s of 1,000 prompt + 200 generated tokens: 10 × (1000 × 0.25 + 200) = 4,500 weighted tokens/s.
    points = [p(0, 0, 0, 0, 0), p(60, 600, 0, 600_000, 120_000)]
    assert pod_demand(points, DemandUnit.TOKENS, 0.25) == pytest.approx(4500)
    assert pod_demand(points, DemandUnit.TOKENS, 0.0) == pytest.approx(2000)


def test_tokens_stay_right_when_the_mix_shifts() -> None:
    """A replica that decodes 4,500 weighted tokens/s (prompt tokens at a quarter) serves 10 chat requests
    a second or 2 RAG ones: in requests per second the two hours differ fivefold, in weighted tokens per
    second they read alike."""
    chat = [p(0, 0, 0, 0, 0), p(60, 600, 0, 600_000, 120_000)]  # 1,000 + 200 tokens each
    rag = [p(0, 0, 0, 0, 0), p(60, 120, 0, 480_000, 150_000)]  # 4,000 + 1,250 tokens each
    assert pod_demand(chat) == pytest.approx(5 * pod_demand(rag))  # type: ignore[operator]
    assert pod_demand(chat, DemandUnit.TOKENS, 0.25) == pytest.approx(
        pod_demand(rag, DemandUnit.TOKENS, 0.25)
    )


def test_tokens_count_the_backlog_at_the_window_s_request_size() -> None:
    points = [p(0, 0, 0, 0, 0), p(60, 600, 60, 600_000, 120_000)]  # 11 req/s arrived, 1,200 tokens each
    assert pod_demand(points, DemandUnit.TOKENS, 0.0) == pytest.approx(11 * 200)


def test_tokens_with_a_restart_count_from_zero() -> None:
    points = [p(0, 100, 0, 10_000, 1_000), p(30, 50, 0, 5_000, 500), p(60, 100, 0, 10_000, 1_000)]
    # 50 requests before the restart and 50 after, 1,000 generated tokens in all: 10 tokens each.
    assert pod_demand(points, DemandUnit.TOKENS, 0.0) == pytest.approx(100 / 60 * 10)


def test_tokens_without_a_finished_request_have_no_size_yet() -> None:
    arriving = [p(0, 0, 0, 0, 0), p(60, 0, 30, 0, 0)]
    rate = pod_demand(arriving, DemandUnit.TOKENS)
    assert isinstance(rate, Missing) and rate.kind is MissingKind.NO_RATE
    assert pod_demand([p(0, 0, 0, 0, 0), p(60, 0, 0, 0, 0)], DemandUnit.TOKENS) == 0.0


def test_tokens_need_token_counters() -> None:
    rate = pod_demand([p(0, 0, 0), p(60, 600, 0)], DemandUnit.TOKENS)
    assert isinstance(rate, Missing) and rate.kind is MissingKind.NOT_EXPORTED


def test_over_window_reaches_back_to_the_window_s_start() -> None:
    points = [p(t, t, 0) for t in (0, 5, 10, 15, 20, 25)]
    assert [q.at for q in over_window(points, 10)] == [15, 20, 25]
    assert [q.at for q in over_window(points, 12)] == [10, 15, 20, 25]
    assert [q.at for q in over_window(points, 100)] == [0, 5, 10, 15, 20, 25]
    assert list(over_window([], 60)) == []


def test_over_window_after_an_outage_reads_the_window_s_own_pages_not_back_to_before_it() -> None:
    # 1 request/s to 20 s, no page from 20 s to 100 s (the load rose to 10/s at 90 s), pages again.
    before = [p(t, t, 0) for t in (0, 5, 10, 15, 20)]
    after = [p(t, 90 + 10 * (t - 90), 0) for t in (100, 105, 110)]
    window = over_window([*before, *after], 30)
    assert [q.at for q in window] == [100, 105, 110]
    assert pod_demand(window) == pytest.approx(10.0)  # not (290 - 20) / 90 = 3 across the outage
    # A page just before the window's start (about one step of the window's own pages) still counts.
    assert [q.at for q in over_window([*before, p(78, 78, 0), *after], 30)] == [78, 100, 105, 110]
    # One page inside the window: the one before counts within one window of its start (a scrape
    # interval is never longer than the window), else the page has no rate yet.
    assert [q.at for q in over_window([p(0, 0, 0), p(10, 10, 0), p(30, 30, 0)], 10)] == [10, 30]
    assert [q.at for q in over_window([*before, p(100, 100, 0)], 30)] == [100]


def test_pending_adds_its_growth_and_what_clears_it_within_a_window() -> None:
    assert pending_demand(growth_per_second([]), 0, 60) == 0
    assert pending_demand(growth_per_second([(0, 0), (10, 30)]), 30, 60) == pytest.approx(3 + 0.5)
    # Shrinking: only what is left to clear.
    assert pending_demand(growth_per_second([(0, 60), (10, 30)]), 30, 60) == pytest.approx(0.5)
    # One reading: what clears it within the window; a pool at zero holding one request asks for > 0.
    assert pending_demand(growth_per_second([(5, 1)]), 1, 60) == pytest.approx(1 / 60)


def test_counters_beyond_a_floats_range_are_no_rate_never_a_made_up_zero() -> None:
    # Two pages whose summed counter overflowed: inf − inf is NaN, which max(0, …) would have made 0.
    points = [DemandPoint(5.0, math.inf, 0.0), DemandPoint(10.0, math.inf, 0.0)]
    rate = pod_demand(points)
    assert isinstance(rate, Missing) and rate.kind is MissingKind.NO_RATE
