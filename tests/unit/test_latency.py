"""The latency SLO's pure parts (SPEC §6): the engines' latency histograms kept per series in the demand
history, the quantile read from them, the guard that raises the value over target, and the headroom."""

from __future__ import annotations

import math

import pytest

from keda_gpu_scaler.collect.demand_history import DemandHistory
from keda_gpu_scaler.collect.inference import POD_PAGE_NAMES
from keda_gpu_scaler.collect.store import Page, Store
from keda_gpu_scaler.core.latency import (
    LatencyRead,
    budget_used,
    count_above,
    guarded_value,
    headroom,
    histogram_quantile,
    late_observations,
    latency_read,
    overshoot,
    spent_headroom,
)
from keda_gpu_scaler.core.slo import SloTarget
from keda_gpu_scaler.core.snapshot import SourceKind
from keda_gpu_scaler.pages.engines import PodSamples, pod_counters
from keda_gpu_scaler.pages.exposition import parse_exposition

URL = "http://10.0.0.1:8000/metrics"
INF = math.inf


def vllm_text(finished: float, ttft: dict[str, float], engine: str = "0") -> str:
    """A vLLM page with a TTFT histogram of cumulative bucket counts (le → count)."""
    lines = [
        f'vllm:num_requests_running{{engine="{engine}",model_name="m"}} 0',
        f'vllm:num_requests_waiting{{engine="{engine}",model_name="m"}} 0',
        f'vllm:request_success_total{{engine="{engine}",model_name="m",finished_reason="stop"}} {finished}',
    ]
    lines += [
        f'vllm:time_to_first_token_seconds_bucket{{engine="{engine}",model_name="m",le="{le}"}} {n}'
        for le, n in ttft.items()
    ]
    count = ttft["+Inf"]
    lines += [
        f'vllm:time_to_first_token_seconds_sum{{engine="{engine}",model_name="m"}} {count * 0.5}',
        f'vllm:time_to_first_token_seconds_count{{engine="{engine}",model_name="m"}} {count}',
    ]
    return "\n".join(lines) + "\n"


def pod(text: str) -> PodSamples:
    return PodSamples("llm", "chat-0", tuple(parse_exposition(text, POD_PAGE_NAMES)), URL)


def test_engines_read_their_latency_histograms_through_the_page_filter() -> None:
    _, counters = pod_counters(pod(vllm_text(1, {"0.1": 3, "1": 7, "+Inf": 8})).samples)
    assert counters.latency[("ttft:le=0.1", "m", "engine=0")] == 3
    assert counters.latency[("ttft:le=+Inf", "m", "engine=0")] == 8
    assert counters.latency[("ttft:count", "m", "engine=0")] == 8
    assert not any(key[0].startswith("tpot") for key in counters.latency)


def test_vllm_time_per_output_token_is_read_per_request_where_it_prints_that() -> None:
    # vLLM 0.10 and later print both: every token's gap (one observation per token, a long tail from the
    # steps a prefill joins) and each finished request's mean, which is what the SLO counts.
    def histogram(name: str, under_50ms: int, count: int) -> str:
        labels = 'engine="0",model_name="m"'
        return (
            f'{name}_bucket{{{labels},le="0.05"}} {under_50ms}\n{name}_bucket{{{labels},le="+Inf"}} {count}\n'
            f"{name}_sum{{{labels}}} {count * 0.03}\n{name}_count{{{labels}}} {count}\n"
        )

    page = vllm_text(4, {"+Inf": 4}) + histogram("vllm:inter_token_latency_seconds", 800, 1000)
    _, per_token = pod_counters(pod(page).samples)
    assert per_token.latency[("itl:count", "m", "engine=0")] == 1000  # an older vLLM: the gaps, as such
    assert not any(key[0].startswith("tpot") for key in per_token.latency)
    page += histogram("vllm:request_time_per_output_token_seconds", 4, 4)
    _, per_request = pod_counters(pod(page).samples)
    assert per_request.latency[("tpot:le=0.05", "m", "engine=0")] == 4
    assert per_request.latency[("tpot:count", "m", "engine=0")] == 4
    assert not any(key[0].startswith("itl") for key in per_request.latency)


def test_a_read_without_latency_leaves_the_histograms_and_reads_everything_else_alike() -> None:
    samples = pod(vllm_text(1, {"0.1": 3, "1": 7, "+Inf": 8})).samples
    reading, counters = pod_counters(samples)
    lean_reading, lean = pod_counters(samples, latency=False)
    assert counters.latency and lean.latency == {}
    assert (lean_reading, lean.finished, lean.prompt_tokens, lean.generation_tokens, lean.sizes) == (
        reading,
        counters.finished,
        counters.prompt_tokens,
        counters.generation_tokens,
        counters.sizes,
    )


def test_sglang_both_spellings_count_once_and_tgi_has_its_per_token_mean() -> None:
    sglang = "".join(
        f'{prefix}num_queue_reqs{{model_name="q"}} 0\n{prefix}num_running_reqs{{model_name="q"}} 0\n'
        f'{prefix}num_requests_total{{model_name="q"}} 5\n'
        f'{prefix}inter_token_latency_seconds_bucket{{model_name="q",le="0.05"}} {n}\n'
        f'{prefix}inter_token_latency_seconds_bucket{{model_name="q",le="+Inf"}} 10\n'
        f'{prefix}inter_token_latency_seconds_sum{{model_name="q"}} 0.4\n'
        f'{prefix}inter_token_latency_seconds_count{{model_name="q"}} 10\n'
        for prefix, n in (("sglang:", 9), ("sglang_", 4))
    )
    _, counters = pod_counters(pod(sglang).samples)
    assert counters.latency[("itl:le=0.05", "q", "dp_rank=", "priority=")] == 9
    assert counters.latency[("itl:count", "q", "dp_rank=", "priority=")] == 10
    tgi = (
        "tgi_queue_size 0\ntgi_batch_current_size 0\ntgi_request_success 3\n"
        'tgi_request_mean_time_per_token_duration_bucket{le="0.02"} 2\n'
        'tgi_request_mean_time_per_token_duration_bucket{le="+Inf"} 3\n'
        "tgi_request_mean_time_per_token_duration_sum 0.07\n"
        "tgi_request_mean_time_per_token_duration_count 3\n"
    )
    _, counters = pod_counters(pod(tgi).samples)
    assert counters.latency == {
        ("tpot:le=0.02", ""): 2,
        ("tpot:le=+Inf", ""): 3,
        ("tpot:sum", ""): 0.07,
        ("tpot:count", ""): 3,
    }


def test_the_history_keeps_each_bucket_per_series_across_a_restart() -> None:
    store = Store()
    history = DemandHistory(forget_after=600)
    store.page_listeners.append(history.on_page)
    store.add_source(URL, SourceKind.INFERENCE, "llm", "chat-0")
    pages = [
        {"0.1": 10, "1": 20, "+Inf": 20},
        {"0.1": 14, "1": 30, "+Inf": 31},  # +4, +10, +11
        {"0.1": 2, "1": 3, "+Inf": 3},  # the engine restarted: counts from 0, +2, +3, +3
        {"0.1": 2, "1": 5, "+Inf": 6},  # +0, +2, +3
    ]
    store.record_page(Page.from_readings(URL, 0, [pod(vllm_text(0, pages[0]))]))
    history.read(pod(vllm_text(0, pages[0])), "auto", None, 60, 0)
    for at, buckets in enumerate(pages[1:], start=1):
        store.record_page(Page.from_readings(URL, at * 5, [pod(vllm_text(at, buckets))]))
    track = history.read(pod(vllm_text(0, pages[0])), "auto", "m", 60, 15)
    assert {k: v for k, v in track.latency.items() if "le=" in k} == {
        "ttft:le=0.1": 6,
        "ttft:le=1": 15,
        "ttft:le=+Inf": 17,
    }
    assert track.latency["ttft:count"] == 17
    assert history.read(pod(vllm_text(0, pages[0])), "auto", "other", 60, 15).latency == {}


def test_a_histogram_restarts_whole_when_its_count_restarts() -> None:
    # Mostly late before the restart (10 of 100 within 1 s); after it, 40 requests, all within 0.1 s. The
    # `le="1"` bucket (10 → 40) alone looks like growth; with its histogram's count restarted, it restarted
    # too: +40, not +30 (which would read as 10 requests over 1 s that never were).
    store = Store()
    history = DemandHistory(forget_after=600)
    store.page_listeners.append(history.on_page)
    store.add_source(URL, SourceKind.INFERENCE, "llm", "chat-0")
    pages = [{"0.1": 5, "1": 10, "+Inf": 100}, {"0.1": 40, "1": 40, "+Inf": 40}]
    store.record_page(Page.from_readings(URL, 0, [pod(vllm_text(100, pages[0]))]))
    history.read(pod(vllm_text(100, pages[0])), "auto", None, 60, 0)
    store.record_page(Page.from_readings(URL, 5, [pod(vllm_text(40, pages[1]))]))
    track = history.read(pod(vllm_text(40, pages[1])), "auto", "m", 60, 5)
    assert {k: v for k, v in track.latency.items() if "le=" in k} == {
        "ttft:le=0.1": 40,
        "ttft:le=1": 40,
        "ttft:le=+Inf": 40,
    }
    assert late_observations("ttft", track.latency, 1.0) == 0


@pytest.mark.parametrize(
    ("buckets", "q", "answer"),
    [
        ({0.1: 50, 0.5: 90, 1.0: 100, INF: 100}, 0.95, (0.75, False)),  # within (0.5, 1]: 0.5 + 0.5 × 5/10
        ({0.1: 50, 0.5: 90, 1.0: 100, INF: 100}, 0.5, (0.1, False)),
        ({0.2: 40, 1.0: 100, INF: 100}, 0.1, (0.05, False)),  # the first bucket counts from 0
        ({0.1: 50, 0.5: 90, 1.0: 94, INF: 100}, 0.95, (1.0, True)),  # in +Inf: the highest finite bound
        ({0.1: 0, INF: 0}, 0.95, None),  # no requests: no latency
        ({0.1: 5, 1.0: 5}, 0.95, None),  # no +Inf bucket: not a histogram
        ({0.1: 50, 0.5: 45, INF: 100}, 0.5, (0.1, False)),  # a dip (a reset in one pod) never counts back
    ],
)
def test_histogram_quantile(buckets: dict[float, float], q: float, answer: tuple[float, bool] | None) -> None:
    found = histogram_quantile(buckets, q)
    assert found == answer if answer is None else found == pytest.approx(answer)


def test_latency_read_sums_buckets_over_pods_and_names_pods_without_the_family() -> None:
    pods = {
        "a": {"ttft:le=0.5": 45, "ttft:le=1": 50, "ttft:le=+Inf": 50, "ttft:sum": 20, "ttft:count": 50},
        "b": {"ttft:le=0.5": 45, "ttft:le=1": 50, "ttft:le=+Inf": 50, "ttft:sum": 30, "ttft:count": 50},
        "c": {},
    }
    read = latency_read("ttft", pods, 0.95)
    assert read.quantile == pytest.approx(0.75) and read.mean == pytest.approx(0.5)
    assert (read.requests, read.pods_read, read.pods_without) == (100, 2, ("c",))
    assert "vllm:time_to_first_token_seconds" in read.family and not read.above_highest_bound
    idle = {"a": {"ttft:le=0.5": 0, "ttft:le=+Inf": 0, "ttft:sum": 0, "ttft:count": 0}}
    nothing = latency_read("ttft", idle, 0.95)
    assert (nothing.quantile, nothing.mean, nothing.pods_read) == (None, None, 1)


def read_of(kind: str, quantile: float | None) -> LatencyRead:
    return LatencyRead(kind, 0.95, quantile, quantile, 10, 1, (), "")


@pytest.mark.parametrize(
    ("ready", "ttft", "tpot", "value", "guarded"),
    [
        (4, 1.0, 0.04, 30.0, 30.0),  # within both targets: unchanged
        (4, 2.0, 0.04, 30.0, 30.0),  # exactly on target: unchanged
        (4, 2.6, 0.04, 30.0, 50.0),  # 30 % over: one pod more (the smallest step the HPA takes) → 5 × 10
        (4, 1.0, 0.1, 30.0, 50.0),  # TPOT 2× over: still one (the next sync reads again)
        (4, 9.0, 0.04, 30.0, 50.0),  # far over: still one
        (20, 2.1, 0.04, 150.0, 230.0),  # 5 % over: 1 pod is within the HPA's tolerance, so 3
        (20, 9.0, 0.04, 150.0, 230.0),  # far over a large fleet: the same step
        (4, 2.6, 0.04, 90.0, 90.0),  # never lowered
        (0, 9.0, 0.04, 30.0, 30.0),  # no ready pod: nothing to scale from
        (4, None, None, 30.0, 30.0),  # no read: no made-up latency
    ],
)
def test_guarded_value(
    ready: int, ttft: float | None, tpot: float | None, value: float, guarded: float
) -> None:
    reads = {"ttft": read_of("ttft", ttft), "tpot": read_of("tpot", tpot)}
    slo = SloTarget(2.0, 50.0, 0.95)
    assert guarded_value(value, ready, 10.0, reads, slo) == pytest.approx(guarded)
    assert guarded_value(value, ready, 10.0, reads, None) == value


@pytest.mark.parametrize(
    ("slo", "rates", "answer"),
    [
        (None, [1, 9], 0.0),  # no SLO: no headroom
        (SloTarget(2.0, None, 0.95), [10, 10, 10], 0.0),  # a steady rate needs none
        # z(0.95) × σ ÷ mean, σ² = Σ of the squared successive differences ÷ 2(n − 1) = 3 × 16 ÷ 6
        (SloTarget(2.0, None, 0.95), [8, 12, 8, 12], 1.6448536 * 8**0.5 / 10),
        # A step is one difference, not noise: σ² = 10² ÷ 10 (its spread around the mean would give σ = 5)
        (SloTarget(2.0, None, 0.95), [10, 10, 10, 20, 20, 20], 1.6448536 * 10**0.5 / 15),
        (SloTarget(2.0, None, 0.5), [8, 12, 8, 12], 0.0),  # a median target: z = 0
        (SloTarget(2.0, None, 0.99), [1, 19, 1, 19], 1.0),  # bounded
        (SloTarget(2.0, None, 0.95), [10], None),  # one rate: not measured
        (SloTarget(2.0, None, 0.95), [0, 0], None),  # nothing arrives: not measured
    ],
)
def test_headroom(slo: SloTarget | None, rates: list[float], answer: float | None) -> None:
    found = headroom(slo, rates)
    assert found == answer if answer is None else found == pytest.approx(answer)


@pytest.mark.parametrize(
    ("bound", "above"),
    [
        (2.0, 10.0),  # on a bucket's bound: what the buckets above hold
        (2.25, 7.5),  # halfway into (2, 2.5]: half of its 5 counted within
        (0.25, 75.0),  # the first bucket counts from 0
        (10.0, 5.0),  # beyond the highest finite bound: the +Inf bucket's
    ],
)
def test_count_above(bound: float, above: float) -> None:
    buckets = {0.5: 50.0, 1.0: 80.0, 2.0: 90.0, 2.5: 95.0, INF: 100.0}
    assert count_above(buckets, bound) == pytest.approx(above)
    assert count_above({0.5: 0.0, INF: 0.0}, bound) is None


def test_budget_used_is_the_share_of_the_allowance_and_never_made_up() -> None:
    slo = SloTarget(2.0, None, 0.95)
    assert budget_used(slo, [(1000.0, 10.0), (1000.0, 40.0)]) == pytest.approx(0.5)  # 2.5 % of 5 %
    assert budget_used(slo, [(1000.0, 150.0)]) == pytest.approx(3.0)
    assert budget_used(slo, [(199.0, 0.0)]) is None  # too few requests: not measured, not 0
    assert spent_headroom(0.4, 0.2) == pytest.approx(0.2)  # at its floor, half
    assert spent_headroom(0.4, 0.8) == pytest.approx(0.32)
    assert spent_headroom(0.4, 3.0) == pytest.approx(0.4)
    assert spent_headroom(0.4, None) == 0.4 and spent_headroom(None, 0.5) is None


def test_late_observations_are_counted_only_where_a_finite_bucket_reaches_the_target() -> None:
    increases = {"ttft:le=0.5": 80.0, "ttft:le=1": 90.0, "ttft:le=+Inf": 100.0, "ttft:count": 100.0}
    assert late_observations("ttft", increases, 1.0) == pytest.approx(10.0)
    assert late_observations("ttft", increases, 0.75) == pytest.approx(15.0)  # within its bucket
    # Beyond every finite bound the histogram cannot tell late from on time: not all of them, not none.
    assert late_observations("ttft", increases, 2.0) is None
    assert late_observations("ttft", {"ttft:le=+Inf": 5.0, "ttft:count": 5.0}, 0.05) is None
    assert late_observations("ttft", {**increases, **{k: 0.0 for k in increases}}, 1.0) is None


def ttft_increases(buckets: dict[str, float], mean: float) -> dict[str, float]:
    """One pod's Track.latency for TTFT: each bucket's increase (le → cumulative count), _sum and _count."""
    return {
        **{f"ttft:le={le}": n for le, n in buckets.items()},
        "ttft:count": buckets["+Inf"],
        "ttft:sum": buckets["+Inf"] * mean,
    }


def test_pods_with_different_bucket_bounds_are_read_on_common_bounds() -> None:
    # A rolling update between two engine builds, each with its own TTFT buckets; every one of the 200
    # first tokens came within 2.5 s: pod a's within (1, 2.5], pod b's within 1 s. Summed bound by bound,
    # 2.5 s counted pod a's only (100 "over 2.5 s") and the quantile fell in the +Inf bucket.
    a = ttft_increases({"0.5": 0, "1": 0, "2.5": 100, "5": 100, "+Inf": 100}, 1.5)
    b = ttft_increases({"0.5": 50, "1": 100, "2": 100, "4": 100, "+Inf": 100}, 0.5)
    read = latency_read("ttft", {"a": a, "b": b}, 0.95, 2.5)
    assert read.requests == 200 and read.missed == 0
    assert not read.above_highest_bound and read.quantile is not None and 2.0 < read.quantile <= 2.5
    # Beyond the lower of the two highest finite bounds (4 s) nothing is known: no count of misses.
    assert latency_read("ttft", {"a": a, "b": b}, 0.95, 4.5).missed is None


def test_a_target_beyond_every_finite_bound_has_no_count_of_misses() -> None:
    # Buckets ending at 2.5 s and a 5 s target: the 10 requests over 2.5 s may or may not be over 5 s.
    pod = ttft_increases({"0.5": 80, "1": 85, "2.5": 90, "+Inf": 100}, 0.3)
    assert latency_read("ttft", {"p": pod}, 0.95, 5.0).missed is None
    assert latency_read("ttft", {"p": pod}, 0.95, 2.5).missed == pytest.approx(10)


def test_a_read_of_no_pod_is_no_latency() -> None:
    read = latency_read("ttft", {}, 0.95, 2.0)
    assert (read.quantile, read.requests, read.missed, read.pods_read) == (None, 0.0, None, 0)
    without = latency_read("ttft", {"a": {"requests": 3.0}}, 0.95, 2.0)
    assert (without.quantile, without.missed, without.pods_without) == (None, None, ("a",))


def test_a_pod_without_a_request_in_the_window_does_not_cut_the_others_buckets() -> None:
    # A rolling update: the old build's buckets reach 10 s and its 300 first tokens all took 5-10 s; the
    # new build's reach 2 s and it served nothing in the window. Cut at the new build's 2 s, the p95 read
    # as 2 s (in +Inf) against a 2.5 s target: under it, and nothing missed.
    busy = {"ttft:le=0.5": 0.0, "ttft:le=1.0": 0.0, "ttft:le=2.5": 0.0, "ttft:le=5.0": 0.0}
    busy |= {"ttft:le=10.0": 300.0, "ttft:le=+Inf": 300.0, "ttft:count": 300.0, "ttft:sum": 2250.0}
    idle = {"ttft:le=0.25": 0.0, "ttft:le=0.5": 0.0, "ttft:le=1.0": 0.0, "ttft:le=2.0": 0.0}
    idle |= {"ttft:le=+Inf": 0.0, "ttft:count": 0.0, "ttft:sum": 0.0}
    both = latency_read("ttft", {"old-0": busy, "new-0": idle}, 0.95, 2.5)
    assert both.quantile == pytest.approx(9.75) and both.missed == pytest.approx(300), both
    assert both.pods_read == 2 and not both.above_highest_bound


def test_a_quantile_beyond_every_bound_below_the_target_is_no_overshoot() -> None:
    # Every bucket below the 2.5 s target, the quantile in +Inf: at least 2 s, maybe far over 2.5 s.
    read = latency_read("ttft", {"a": {"ttft:le=2.0": 0.0, "ttft:le=+Inf": 100.0, "ttft:count": 100.0}}, 0.95)
    assert read.above_highest_bound and read.quantile == 2.0
    slo = SloTarget(2.5, None)
    assert overshoot({"ttft": read}, slo) is None
    assert overshoot({"ttft": read}, SloTarget(1.0, None)) == pytest.approx(2.0)  # over a lower one: known


def test_a_quantile_beyond_a_highest_bound_equal_to_the_target_is_over_it() -> None:
    # The target is the highest finite bound (an older build's 10 s) and the p95 falls in +Inf: every such
    # request took longer than the target. Read as exactly 1, the guard waited for ever.
    buckets = {"ttft:le=5.0": 0.0, "ttft:le=10.0": 0.0, "ttft:le=+Inf": 100.0, "ttft:count": 100.0}
    read = latency_read("ttft", {"a": buckets}, 0.95)
    ratio = overshoot({"ttft": read}, SloTarget(10.0, None))
    assert read.above_highest_bound and ratio is not None and ratio > 1
    assert guarded_value(10.0, 2, 5.0, {"ttft": read}, SloTarget(10.0, None)) == 15.0
