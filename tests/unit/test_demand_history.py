"""The per-pod history `metric: demand` takes rates over: fed by the store, bounded, evicted with the pod."""

from __future__ import annotations

import pytest

from keda_gpu_scaler.collect import demand_history
from keda_gpu_scaler.collect.demand_history import DemandHistory
from keda_gpu_scaler.collect.inference import POD_PAGE_NAMES
from keda_gpu_scaler.collect.store import Page, Store
from keda_gpu_scaler.core.demand import DemandUnit, pod_demand
from keda_gpu_scaler.core.snapshot import SourceKind, Track
from keda_gpu_scaler.pages.engines import MissingKind, PodSamples
from keda_gpu_scaler.pages.exposition import parse_exposition

URL = "http://10.0.0.1:8000/metrics"


def vllm(finished: float | str, running: float | str = 0) -> PodSamples:
    text = (
        f'vllm:num_requests_running{{engine="0"}} {running}\n'
        'vllm:num_requests_waiting{engine="0"} 0\n'
        f'vllm:request_success_total{{engine="0",finished_reason="stop"}} {finished}\n'
    )
    return PodSamples("llm", "chat-0", tuple(parse_exposition(text, POD_PAGE_NAMES)), URL)


def page(at: float, samples: PodSamples, source: str = URL) -> Page:
    return Page.from_readings(source, at, [samples])


def store_with_history(forget_after: float = 600) -> tuple[Store, DemandHistory]:
    store = Store()
    history = DemandHistory(forget_after=forget_after)
    store.page_listeners.append(history.on_page)
    store.removal_listeners.append(history.on_removed)
    store.add_source(URL, SourceKind.INFERENCE, "llm", "chat-0")
    return store, history


def read(history: DemandHistory, at: float, window: float = 60, model: str | None = None) -> Track:
    return history.read(vllm(0), "auto", model, window, at)


def test_only_pages_a_trigger_asks_about_keep_points() -> None:
    store, history = store_with_history()
    for at in range(0, 100, 5):
        store.record_page(page(at, vllm(at)))
    assert len(history) == 0
    # Asked about: it starts with the newest page the store recorded, then gains every new one.
    track = read(history, 100)
    assert (track.used, [p.at for p in track.points], track.engine) == (1, [95], "vllm")
    store.record_page(page(100, vllm(100)))
    store.record_page(page(100, vllm(100)))  # the same instant again: one point
    track = read(history, 100)
    assert (track.used, [p.at for p in track.points]) == (2, [95, 100])
    assert [p.finished for p in track.points] == [0, 5]


def test_points_older_than_the_window_go() -> None:
    store, history = store_with_history()
    store.record_page(page(0, vllm(0)))
    read(history, 0, window=20)
    for at in range(5, 200, 5):
        store.record_page(page(at, vllm(at)))
    assert [p.at for p in read(history, 195, window=20).points] == [175, 195]
    assert read(history, 195, window=20).used == 5


def test_points_are_capped_whatever_the_window() -> None:
    store, history = store_with_history()
    store.record_page(page(0, vllm(0)))
    read(history, 0, window=600)
    for at in range(1, 3 * demand_history.MAX_POINTS):
        store.record_page(page(at * 0.1, vllm(at)))
    assert read(history, 300, window=600).used <= demand_history.MAX_POINTS


def models_page(finished: dict[str, float]) -> PodSamples:
    """A vLLM page serving `finished`'s models (model → its finished requests), 3 in flight each."""
    text = "".join(
        f'vllm:num_requests_running{{model_name="{model}"}} 3\n'
        f'vllm:num_requests_waiting{{model_name="{model}"}} 0\n'
        f'vllm:request_success_total{{finished_reason="stop",model_name="{model}"}} {count}\n'
        for model, count in finished.items()
    )
    return PodSamples("llm", "chat-0", tuple(parse_exposition(text, POD_PAGE_NAMES)), URL)


def test_series_churn_keeps_only_the_totals_the_window_needs() -> None:
    history = DemandHistory(forget_after=600)
    # One model served at a time, its name changing every page (adapters loaded and unloaded).
    for at in range(3000):
        history.on_page(SourceKind.INFERENCE, page(at, models_page({f"adapter-{at}": at})))
        history.read(vllm(0), "auto", None, 30, at)  # a demand trigger asks every time
    (kept,) = history._pages.values()
    (series,) = kept.by_format.values()
    # The window's 31 points and the page's one model: a handful of totals, not one per name ever seen.
    assert len(series.running) <= 3
    assert sum(len(point.totals) for point in series.points) <= 3 * len(series.points)


def test_dropping_the_totals_of_gone_series_changes_no_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    def finished(at: float) -> dict[str, float]:
        # b serves 5/s throughout; a 10/s until 50 s, gone until 120 s, then back counting from 0; c
        # appears for one page at 70 s.
        served = {"b": 1000 + 5 * at}
        if at < 50:
            served["a"] = 5000 + 10 * at
        if at >= 120:
            served["a"] = 10 * (at - 120)
        if at == 70:
            served["c"] = 7
        return served

    def rates() -> list[tuple[float | MissingKind, ...]]:
        history = DemandHistory(forget_after=600)
        read: list[tuple[float | MissingKind, ...]] = []
        for at in range(0, 200, 5):
            history.on_page(SourceKind.INFERENCE, page(at, models_page(finished(at))))
            for model in (None, "a", "b"):
                track = history.read(vllm(0), "auto", model, 30, at)
                rate = pod_demand(track.points, DemandUnit.REQUESTS)
                read.append(rate if isinstance(rate, float) else rate.kind)
        return read

    dropped = rates()
    monkeypatch.setattr(demand_history.SeriesHistory, "_forget_gone", lambda self, values: None)
    assert dropped == pytest.approx(rates())


def test_a_removed_page_source_takes_its_points() -> None:
    store, history = store_with_history()
    store.record_page(page(0, vllm(0)))
    read(history, 0)
    assert len(history) == 1
    store.remove_source(URL)
    assert len(history) == 0
    # Asked about again, it starts from nothing: its old page is gone too.
    assert read(history, 1).points == []


def test_histories_no_trigger_asks_for_are_forgotten() -> None:
    store, history = store_with_history(forget_after=100)
    store.record_page(page(0, vllm(0)))
    read(history, 0)
    for at in range(10, 100, 10):
        store.record_page(page(at, vllm(at)))
    assert len(history) == 1
    for at in range(100, 180, 10):
        store.record_page(page(at, vllm(at)))
    assert len(history) == 0


def test_an_unusable_page_is_a_problem_until_a_usable_one_comes() -> None:
    store, history = store_with_history()
    store.record_page(page(0, vllm(10)))
    read(history, 0)
    store.record_page(page(5, vllm("NaN")))
    track = read(history, 5)
    assert track.problem is not None and track.problem.kind is MissingKind.NO_VALUE
    store.record_page(page(10, vllm(20)))
    track = read(history, 10)
    assert track.problem is None
    assert [(p.at, p.finished) for p in track.points] == [(0, 0), (10, 10)]


def test_pages_of_other_kinds_are_not_read() -> None:
    history = DemandHistory(forget_after=600)
    history.on_page(SourceKind.SCRAPE, page(0, vllm(0)))
    assert read(history, 0).points == []


def vllm_tokens(flight: float, finished: float, prompt: float, generated: float) -> PodSamples:
    """A vLLM page whose per-request token histograms observe `finished` requests of 1,000 prompt and 200
    generated tokens each, while the token counters count `prompt` and `generated` so far."""
    text = (
        f'vllm:num_requests_running{{engine="0"}} {flight}\nvllm:num_requests_waiting{{engine="0"}} 0\n'
        f'vllm:request_success_total{{engine="0",finished_reason="stop"}} {finished}\n'
        f'vllm:prompt_tokens_total{{engine="0"}} {prompt}\nvllm:generation_tokens_total{{engine="0"}} {generated}\n'
        f'vllm:request_prompt_tokens_sum{{engine="0"}} {1000 * finished}\n'
        f'vllm:request_prompt_tokens_count{{engine="0"}} {finished}\n'
        f'vllm:request_generation_tokens_sum{{engine="0"}} {200 * finished}\n'
        f'vllm:request_generation_tokens_count{{engine="0"}} {finished}\n'
    )
    return PodSamples("llm", "chat-0", tuple(parse_exposition(text, POD_PAGE_NAMES)), URL)


def test_a_request_s_size_comes_from_the_per_request_histograms_while_finishes_lag() -> None:
    # A step to 10 req/s at 0 s, each request 1,000 prompt + 200 generated tokens over 20 s. At 30 s:
    # 300 arrived, 100 finished, 200 in flight; the counters hold every admitted prompt (300,000) and
    # 40,000 generated tokens, so counters over finishes read 3,400 tokens a request (2.8x); the
    # histograms, observed as each request finishes, read the true 1,200.
    store, history = store_with_history()
    store.record_page(page(0, vllm_tokens(0, 0, 0, 0)))
    read(history, 0)
    store.record_page(page(30, vllm_tokens(200, 100, 300_000, 40_000)))
    points = read(history, 30, window=30).points
    assert pod_demand(points, DemandUnit.TOKENS, 1.0) == pytest.approx(10 * 1200)


def vllm_counters(finished: float, prompt: float | str, generated: float) -> PodSamples:
    text = (
        'vllm:num_requests_running{engine="0"} 0\nvllm:num_requests_waiting{engine="0"} 0\n'
        f'vllm:request_success_total{{engine="0",finished_reason="stop"}} {finished}\n'
        f'vllm:prompt_tokens_total{{engine="0"}} {prompt}\nvllm:generation_tokens_total{{engine="0"}} {generated}\n'
    )
    return PodSamples("llm", "chat-0", tuple(parse_exposition(text, POD_PAGE_NAMES)), URL)


def test_a_series_missing_from_one_page_is_stepped_against_its_last_value_when_it_returns() -> None:
    # One NaN prompt-token sample drops the role from that page; back, its series counts on from 1000:
    # the 2000 tokens meanwhile are no new baseline's loss (SPEC §6: rates per series, as rate() takes them).
    store, history = store_with_history()
    for at, finished, prompt, generated in ((0, 0, 0, 0), (5, 10, 1000, 500), (10, 20, "NaN", 1000)):
        store.record_page(page(at, vllm_counters(finished, prompt, generated)))
        read(history, at, window=30)
    store.record_page(page(15, vllm_counters(30, 3000, 1500)))
    points = read(history, 15, window=30).points
    assert [(p.at, p.prompt_tokens) for p in points] == [(0, 0.0), (15, 3000.0)]
    # 30 requests of (3000 + 1500) / 30 = 150 tokens over 15 s.
    assert pod_demand(points, DemandUnit.TOKENS) == pytest.approx(300.0)
    # Absent for longer than the kept points reach, it leaves without a step; back, it starts a baseline.
    store.record_page(page(20, vllm_counters(40, "NaN", 2000)))
    store.record_page(page(60, vllm_counters(80, "NaN", 4000)))
    store.record_page(page(65, vllm_counters(90, 9000, 4500)))
    store.record_page(page(70, vllm_counters(100, 9500, 5000)))
    points = read(history, 70, window=30).points
    assert points[-1].prompt_tokens is not None and points[-1].prompt_tokens - points[0].prompt_tokens == 500


def test_a_nan_on_the_window_s_first_page_shortens_the_span_never_drops_the_rate() -> None:
    # 10 requests/s; the 30 s page (the first of the window read at 60 s) has a NaN in-flight count. The
    # pod had six good pages in the window: its rate is its own, not "one page so far" (the mean of others).
    history = DemandHistory(forget_after=600)
    for at in range(0, 65, 5):
        samples = vllm(10 * at, "NaN" if at == 30 else 5)
        history.on_page(SourceKind.INFERENCE, page(at, samples))
        track = history.read(samples, "auto", None, 30, at)
    assert track.problem is None and [p.at for p in track.points] == [35, 60]
    assert pod_demand(track.points, DemandUnit.REQUESTS) == pytest.approx(10)


def triton(m_finished: float, n_finished: float | str) -> PodSamples:
    text = (
        'nv_inference_pending_request_count{model="m",version="1"} 0\n'
        'nv_inference_pending_request_count{model="n",version="1"} 0\n'
        f'nv_inference_request_success{{model="m",version="1"}} {m_finished}\n'
        f'nv_inference_request_success{{model="n",version="1"}} {n_finished}\n'
    )
    return PodSamples("llm", "triton-0", tuple(parse_exposition(text, POD_PAGE_NAMES)), URL)


def test_a_nan_on_another_model_s_counter_never_leaves_an_old_rate() -> None:
    # Model m takes 10/s until 30 s, 2/s after; from 30 s on model n's counter is NaN, so no page adds a
    # point. The rate of m was taken between the last points before 30 s, ten minutes old.
    history = DemandHistory(forget_after=6000)
    for at in range(0, 605, 5):
        m = 10 * at if at <= 30 else 300 + 2 * (at - 30)
        samples = triton(m, "NaN" if at > 30 else 5 * at)
        history.on_page(SourceKind.INFERENCE, page(at, samples))
        track = history.read(samples, "triton", "m", 30, at)
    assert track.points == [] and track.problem is not None and track.problem.kind is MissingKind.NO_VALUE
