"""`metric: demand` through counter resets: rates per series, as Prometheus' sum(rate()) takes them (SPEC §6).

Each case is a pod finishing 10 requests a second, read every 5 s over a 30 s window, while one of its
counter series resets, appears, vanishes or steps back; summed first and checked for a reset as a total,
each read hundreds of thousands of requests a second.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from keda_gpu_scaler.collect import demand_history
from keda_gpu_scaler.collect.demand_history import DemandHistory
from keda_gpu_scaler.collect.inference import POD_PAGE_NAMES
from keda_gpu_scaler.collect.store import Page
from keda_gpu_scaler.core.demand import DemandUnit, pod_demand
from keda_gpu_scaler.core.snapshot import SourceKind
from keda_gpu_scaler.pages.engines import Missing, PodSamples
from keda_gpu_scaler.pages.exposition import parse_exposition

URL = "http://10.0.0.1:8000/metrics"
TRUTH = 10.0  # requests per second
PAST = 100_000  # what each counter counted before the test's minute


def samples(text: str) -> PodSamples:
    return PodSamples("llm", "chat-0", tuple(parse_exposition(text, POD_PAGE_NAMES)), URL)


def vllm_engines(engines: dict[str, float], in_flight: float = 10) -> str:
    """A data-parallel vLLM page: per engine, its finished requests (stop) and 1 abort."""
    lines = []
    for engine, finished in engines.items():
        lines += [
            f'vllm:num_requests_running{{engine="{engine}",model_name="m"}} {in_flight}',
            f'vllm:num_requests_waiting{{engine="{engine}",model_name="m"}} 0',
            f'vllm:request_success_total{{engine="{engine}",finished_reason="stop",model_name="m"}} {finished}',
            f'vllm:request_success_total{{engine="{engine}",finished_reason="abort",model_name="m"}} 1',
        ]
    return "\n".join(lines) + "\n"


def one_dp_engine_restarting(t: float) -> str:
    # Engine 1 restarts at 32 s: from then on it counts from 0 (its 10 requests in flight lost).
    restarted = t >= 32
    return vllm_engines(
        {"0": PAST + 5 * t, "1": 5 * (t - 32) if restarted else PAST + 5 * t},
    )


def triton_version_rolling(t: float) -> str:
    # Model m (5/s) rolls: version 1 serves until 40 s, version 2 from 35 s (both loaded for one scrape),
    # counting from 0; model n serves 5/s throughout.
    lines = []
    for model, version, serving, finished in (
        ("m", "1", t < 40, PAST + 5 * min(t, 35)),
        ("m", "2", t >= 35, 5 * (t - 35)),
        ("n", "1", True, PAST + 5 * t),
    ):
        if serving:
            lines += [
                f'nv_inference_pending_request_count{{model="{model}",version="{version}"}} 2',
                f'nv_inference_request_success{{model="{model}",version="{version}"}} {finished}',
            ]
    return "\n".join(lines) + "\n"


def a_finished_counter_stepping_back(t: float) -> str:
    # The abort series reads 12, then 11 from 40 s on (a recount: one series went down, by 1), on a page
    # where no request finished since the last (requests finish in bursts: none in 35..40 s, 100 by 45).
    finished = PAST + 10 * (35 if 35 <= t <= 40 else t)
    abort = 12 if t < 40 else 11
    return vllm_engines({"0": finished}).replace(
        '"abort",model_name="m"} 1', f'"abort",model_name="m"}} {abort}'
    )


def a_large_finished_counter_stepping_back(t: float) -> str:
    # The stop series, which counted 100,000 before, reads 1 less at 40 s than it read at 35 s (a recount
    # of a large total; requests finish in bursts: none in 35..40 s), then goes on: taken as a restart it
    # would count its whole 100,000 as arrivals.
    return vllm_engines({"0": PAST + 10 * (35 if 35 <= t <= 40 else t) - (1 if t == 40 else 0)})


def a_series_appearing(t: float) -> str:
    # Engine 1's series are not printed until 40 s (its first page carries all it counted before).
    return vllm_engines({"0": PAST + 5 * t, **({"1": PAST + 5 * t} if t >= 40 else {})})


def a_series_vanishing(t: float) -> str:
    # Engine 1 is missing from one page (45 s), then back.
    return vllm_engines({"0": PAST + 5 * t, **({} if t == 45 else {"1": PAST + 5 * t})})


CASES = [
    one_dp_engine_restarting,
    triton_version_rolling,
    a_finished_counter_stepping_back,
    a_large_finished_counter_stepping_back,
    a_series_appearing,
    a_series_vanishing,
]


def rate_at_the_end(page_at: Callable[[float], str]) -> float:
    history = DemandHistory(forget_after=600)
    for at in range(0, 65, 5):
        history.on_page(SourceKind.INFERENCE, Page.from_readings(URL, at, [samples(page_at(at))]))
        history.read(samples(""), "auto", None, 30, at)  # asked about from the first page on
    rate = pod_demand(history.read(samples(""), "auto", None, 30, 60).points, DemandUnit.REQUESTS)
    assert not isinstance(rate, Missing), rate
    return rate


@pytest.mark.parametrize("page_at", CASES, ids=lambda case: case.__name__)
def test_demand_stays_near_the_truth_through_a_reset_of_one_series(page_at: Callable[[float], str]) -> None:
    rate = rate_at_the_end(page_at)
    assert TRUTH / 3 <= rate <= TRUTH * 3, rate


def test_a_restarted_engine_s_requests_in_flight_count_from_an_empty_engine() -> None:
    # Over 30..60 s: 150 finished on engine 0, 140 on engine 1 since its restart; 20 in flight at both
    # ends, but engine 1's 10 before its restart were lost (never finished) and the 10 it holds after
    # arrived after: counted from an empty engine, 300 arrived, not 290.
    assert rate_at_the_end(one_dp_engine_restarting) == pytest.approx((150 + 140 + 10) / 30)


def test_a_page_is_worked_out_once_whatever_the_models_and_engines_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads: list[int] = []
    original = demand_history.counters_of
    monkeypatch.setattr(demand_history, "counters_of", lambda *args: reads.append(1) or original(*args))
    history = DemandHistory(forget_after=600)
    variants = [(engine, model) for engine in ("auto", "vllm") for model in (None, "m", *"abcdef")]
    for at in range(0, 65, 5):
        history.on_page(SourceKind.INFERENCE, Page.from_readings(URL, at, [samples(a_series_vanishing(at))]))
        for engine, model in variants:
            history.read(samples(""), engine, model, 30, at)
    # One history for the page, and one reading of its counters per page arriving: 16 variants asking
    # for it change neither.
    assert len(history) == 1
    assert len(reads) == 13


def served(finished: float, in_flight: float = 10) -> PodSamples:
    return samples(
        vllm_engines({"0": finished}, in_flight).replace(
            '"abort",model_name="m"} 1', '"abort",model_name="m"} 0'
        )
    )


def test_a_restart_across_a_page_outage_to_more_than_half_the_old_count_counts_from_zero() -> None:
    history = DemandHistory(forget_after=600)
    # 10 requests/s, read every 5 s: the counter reaches 1000 at 100 s.
    for at in range(40, 105, 5):
        history.on_page(SourceKind.INFERENCE, Page.from_readings(URL, at, [served(10 * at)]))
        history.read(samples(""), "auto", None, 90, at)
    # The page cannot be read for 70 s (a window that spans the outage takes its rate across it: counters
    # keep counting). The server restarted at 110 s and served 10/s since: at 170 s its counter reads 600,
    # down from 1000.
    history.on_page(SourceKind.INFERENCE, Page.from_readings(URL, 170, [served(600)]))
    rate = pod_demand(history.read(samples(""), "auto", None, 90, 170).points, DemandUnit.REQUESTS)
    # Counted from 0 (SPEC §6): from 800 at 80 s, 200 more to 100 s, then 600 finished and 10 in flight
    # into an empty server (the 10 it held lost, still arrived): 810 over 90 s. As a new baseline, 210 / 90.
    assert rate == pytest.approx(810 / 90)


def test_a_young_server_restarting_between_two_pages_counts_from_zero() -> None:
    history = DemandHistory(forget_after=600)
    # Started at 0 s serving 2 requests/s: 0 finished, then 10 at 5 s; it restarts at 5.5 s and has
    # finished 9 by 10 s (10 -> 9, more than half of 10, but no more than 2/s counts in 5 s).
    for at, finished in ((0, 0), (5, 10), (10, 9)):
        history.on_page(SourceKind.INFERENCE, Page.from_readings(URL, at, [served(finished, 2)]))
        history.read(samples(""), "auto", None, 10, at)
    rate = pod_demand(history.read(samples(""), "auto", None, 10, 10).points, DemandUnit.REQUESTS)
    # 10 + 9 finished, 2 in flight into the empty restarted server: 21 over 10 s. As a new baseline, 1/s.
    assert rate == pytest.approx((10 + 9 + 2) / 10)


def test_a_step_back_that_the_gap_could_not_have_counted_is_a_recount() -> None:
    history = DemandHistory(forget_after=600)
    # 10/s up to 1000 at 100 s, then 990 at 105 s: 990 is more than 10/s counts in 5 s, so a recount
    # (one copy read instead of another), never 990 requests arriving.
    for at in range(40, 105, 5):
        history.on_page(SourceKind.INFERENCE, Page.from_readings(URL, at, [served(10 * at)]))
        history.read(samples(""), "auto", None, 30, at)
    history.on_page(SourceKind.INFERENCE, Page.from_readings(URL, 105, [served(990)]))
    rate = pod_demand(history.read(samples(""), "auto", None, 30, 105).points, DemandUnit.REQUESTS)
    assert rate == pytest.approx(250 / 30)


def sglang_priorities(t: float) -> str:
    """SGLang with --enable-priority-scheduling: its tokenizer counts each priority's requests apart
    (priority 0 at 6/s, priority 1 at 4/s); its scheduler's gauges print the total under priority=""."""
    gauges = 'dp_rank="0",model_name="m",pp_rank="0",priority="",tp_rank="0"'
    lines = [f"sglang:num_running_reqs{{{gauges}}} 10", f"sglang:num_queue_reqs{{{gauges}}} 0"]
    for priority, rate in (("0", 6), ("1", 4)):
        labels = f'engine_type="unified",model_name="m",priority="{priority}"'
        lines.append(f"sglang:num_requests_total{{{labels}}} {PAST + rate * t}")
    return "\n".join(lines) + "\n"


def test_sglang_requests_of_every_priority_are_counted() -> None:
    # Taken as copies of one value, the larger priority's series alone read 6/s for a pod taking 10.
    assert rate_at_the_end(sglang_priorities) == pytest.approx(TRUTH)
