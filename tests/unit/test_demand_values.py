"""demand over a target's pods: rates from the history, the mean for a pod without one, the pool added."""

from __future__ import annotations

import pytest

from keda_gpu_scaler.collect.demand_history import DemandHistory
from keda_gpu_scaler.collect.inference import POD_PAGE_NAMES
from keda_gpu_scaler.collect.store import Page
from keda_gpu_scaler.core.demand_values import demand_pod_values as pod_values_of_tracks
from keda_gpu_scaler.core.demand_values import is_measured, with_pending
from keda_gpu_scaler.core.errors import NoData
from keda_gpu_scaler.core.scaling import PodRow, evaluate
from keda_gpu_scaler.core.snapshot import SourceKind
from keda_gpu_scaler.core.trigger import Aggregation, TriggerSpec
from keda_gpu_scaler.core.trigger_parse import parse_trigger
from keda_gpu_scaler.pages.engines import PodSamples
from keda_gpu_scaler.pages.exposition import parse_exposition

SPEC = parse_trigger({"metric": "demand", "threshold": "10", "podNamePrefix": "chat-", "window": "60"})
POOLED = parse_trigger(
    {"metric": "demand", "threshold": "10", "podNamePrefix": "chat-", "window": "60", "inferencePool": "p"}
)


def pod(name: str, finished: float | str, flight: float = 0) -> PodSamples:
    text = (
        f'vllm:num_requests_running{{engine="0"}} {flight}\nvllm:num_requests_waiting{{engine="0"}} 0\n'
        f'vllm:request_success_total{{engine="0",finished_reason="stop"}} {finished}\n'
    )
    return PodSamples("llm", name, tuple(parse_exposition(text, POD_PAGE_NAMES)))


def demand_pod_values(
    history: DemandHistory, pages: list[PodSamples], spec: TriggerSpec, now: float
) -> tuple[dict[str, PodRow], dict[str, str], tuple[str, ...]]:
    """The pods' values from their pages' tracks, read as a snapshot reads them."""
    tracks = [(p.pod, history.read(p, spec.engine, spec.model, spec.window, now)) for p in pages]
    return pod_values_of_tracks(tracks, spec)


def history_of(pages: dict[float, list[PodSamples]]) -> DemandHistory:
    history = DemandHistory(forget_after=600)
    for at, ps in sorted(pages.items()):
        for p in ps:
            history.on_page(SourceKind.INFERENCE, Page.from_readings(f"url-{p.pod}", at, [p]))
            history.read(p, "auto", None, 60, at)  # asked about from its first page on
    return history


def test_rates_and_the_mean_for_a_pod_without_one() -> None:
    history = history_of(
        {
            0: [pod("chat-0", 0), pod("chat-1", 0)],
            60: [pod("chat-0", 600), pod("chat-1", 300), pod("chat-2", 5)],
        }
    )
    pages = [pod("chat-0", 600), pod("chat-1", 300), pod("chat-2", 5)]
    rows, problems, notes = demand_pod_values(history, pages, SPEC, 60)
    assert {name: row[2] for name, row in rows.items()} == {"chat-0": 10, "chat-1": 5, "chat-2": 7.5}
    assert problems == {} and "mean of the others" in notes[0]


def test_no_pod_with_a_rate_is_no_data() -> None:
    history = history_of({0: [pod("chat-0", 0)]})
    with pytest.raises(NoData, match="no target pod has a rate yet"):
        demand_pod_values(history, [pod("chat-0", 0)], SPEC, 0)


def test_an_unusable_newest_page_is_a_missing_pod() -> None:
    history = history_of(
        {0: [pod("chat-0", 0), pod("chat-1", 0)], 60: [pod("chat-0", 600), pod("chat-1", "NaN")]}
    )
    rows, problems, _ = demand_pod_values(history, [pod("chat-0", 600), pod("chat-1", "NaN")], SPEC, 60)
    assert set(rows) == {"chat-0"} and "chat-1" in problems


def test_an_engine_without_a_finished_counter_is_no_data_naming_it() -> None:
    llamacpp = PodSamples(
        "llm",
        "chat-0",
        tuple(parse_exposition("llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\n")),
    )
    history = history_of({0: [llamacpp]})
    with pytest.raises(NoData, match="llamacpp exports no counter of finished requests"):
        demand_pod_values(history, [llamacpp], SPEC, 0)


def test_pending_adds_to_a_total_and_its_share_to_a_mean() -> None:
    rows = {"chat-0": ("chat-0", "vllm", 4.0, 0), "chat-1": ("chat-1", "vllm", 6.0, 0)}
    total = evaluate(rows, (), POOLED, Aggregation.SUM)
    added, note, _ = with_pending(total, POOLED, 3, 30)  # growth 3/s, 30 / 60 s to clear
    assert added.value == pytest.approx(10 + 3.5) and "30 pending" in note
    mean = evaluate(rows, (), POOLED, Aggregation.MEAN)
    assert with_pending(mean, POOLED, 3, 30)[0].value == pytest.approx(5 + 3.5 / 2)


def test_a_pool_at_zero_holding_requests_is_active() -> None:
    zero = evaluate({}, (), POOLED, Aggregation.SUM)
    assert not zero.active
    woken, _, _ = with_pending(zero, POOLED, 0, 2)
    assert woken.active and woken.value == pytest.approx(2 / 60)
    assert woken.what_if.average_value == 1
    idle, _, _ = with_pending(zero, POOLED, 0, 0)
    assert not idle.active and idle.value == 0


def test_pending_sizes_on_top_of_the_fresh_pods_never_on_top_of_the_starting_pod_floor() -> None:
    # 1 Ready pod serving 30/s (threshold 10) and 228 requests held (228 / 60 s to clear them).
    fresh = {"chat-0": ("chat-0", "vllm", 30.0, 0)}
    for starting in (5, 7, 9):
        pods = [f"chat-s{i}" for i in range(starting)]
        floor = evaluate(fresh, (), POOLED, Aggregation.SUM, pods)
        assert floor.value == (1 + starting) * 10  # SPEC §4: N × T while scaling up
        sized, note, _ = with_pending(floor, POOLED, 0, 228)
        # max(floor, S + pending): the pods on their way serve the same queue, so no +2 at every sync.
        assert sized.value == floor.value and "fresh pods' 30" in note
    few = evaluate(fresh, (), POOLED, Aggregation.SUM, ["chat-s0"])
    assert with_pending(few, POOLED, 0, 228)[0].value == pytest.approx(30 + 228 / 60)
    # A per-pod mean: the same rule, per Ready pod (the HPA multiplies a Value metric by its ready pods).
    mean = evaluate(fresh, (), POOLED, Aggregation.MEAN, ["chat-s0"])
    assert with_pending(mean, POOLED, 0, 228)[0].value == pytest.approx(30 + 228 / 60)


def tokens_pod(name: str, finished: float, flight: float, prompt: float, generated: float) -> PodSamples:
    text = (
        f'vllm:num_requests_running{{engine="0"}} {flight}\nvllm:num_requests_waiting{{engine="0"}} 0\n'
        f'vllm:request_success_total{{engine="0",finished_reason="stop"}} {finished}\n'
        f'vllm:prompt_tokens_total{{engine="0"}} {prompt}\nvllm:generation_tokens_total{{engine="0"}} {generated}\n'
    )
    return PodSamples("llm", name, tuple(parse_exposition(text, POD_PAGE_NAMES)))


def test_only_a_pods_own_rate_counts_as_measured_never_an_assumed_one() -> None:
    # What threshold: auto learns from: chat-0's measured rate; not chat-1, whose requests arrive but none
    # finished (sized at one replica's worth), nor chat-2, with one page (the mean of the others).
    spec = parse_trigger(
        {"metric": "demand", "threshold": "10", "podNamePrefix": "chat-", "window": "60", "inferencePool": "p",
         "demandUnit": "tokens"}
    )  # fmt: skip
    first = [tokens_pod("chat-0", 0, 0, 0, 0), tokens_pod("chat-1", 0, 0, 0, 0)]
    last = [
        tokens_pod("chat-0", 600, 0, 60_000, 6_000),
        tokens_pod("chat-1", 0, 20, 20_000, 500),
        tokens_pod("chat-2", 5, 0, 500, 50),
    ]
    history = history_of({0: first, 60: last})
    rows, _, _ = demand_pod_values(history, last, spec, 60)
    assert {name: is_measured(row) for name, row in rows.items()} == {
        "chat-0": True,
        "chat-1": False,
        "chat-2": False,
    }


def test_a_pod_taking_requests_none_finished_without_a_pool_is_missing_never_the_mean_of_the_others() -> None:
    # demandUnit tokens, no inferencePool: chat-1 has pages over the window and requests arriving (in
    # flight 2 -> 8), none finished, so the size of its requests is not known. It is no pod with one page
    # (SPEC §6's mean of the others): a gap in data, a missing pod (SPEC §4), which never scales down.
    spec = parse_trigger(
        {
            "metric": "demand",
            "threshold": "1000",
            "podNamePrefix": "chat-",
            "window": "60",
            "demandUnit": "tokens",
        }
    )
    first = [tokens_pod("chat-0", 0, 0, 0, 0), tokens_pod("chat-1", 5, 2, 0, 0)]
    last = [tokens_pod("chat-0", 10, 0, 1000, 2000), tokens_pod("chat-1", 5, 8, 30_000, 10_000)]
    history = history_of({0: first, 60: last})
    rows, problems, notes = demand_pod_values(history, last, spec, 60)
    assert set(rows) == {"chat-0"} and rows["chat-0"][2] == pytest.approx(50.0)
    assert "no request finished" in problems["chat-1"] and not any("mean of the others" in n for n in notes)
    evaluation = evaluate(rows, problems.keys(), spec, Aggregation.SUM)
    assert evaluation.value == pytest.approx(50 + 1000) and evaluation.what_if.average_value == 2
    # A pod with one page still counts as the mean of the others.
    history = history_of({0: first[:1], 60: [*last[:1], tokens_pod("chat-2", 5, 0, 500, 50)]})
    rows, problems, _ = demand_pod_values(history, [last[0], tokens_pod("chat-2", 5, 0, 500, 50)], spec, 60)
    assert rows["chat-2"][2] == pytest.approx(50.0) and problems == {}


def test_an_empty_pool_leaves_a_per_pod_maximum_as_active_as_without_it() -> None:
    """`aggregation: max`: activity is on the busiest pod (plus pending), as without a pool (SPEC §4)."""
    from keda_gpu_scaler.core.scaling import evaluate, pod_row
    from keda_gpu_scaler.core.trigger import Aggregation

    base = {"metric": "demand", "threshold": "10", "podNamePrefix": "chat-", "window": "60"}
    base |= {"aggregation": "max", "activationThreshold": "5"}
    plain, pooled_spec = parse_trigger(base), parse_trigger({**base, "inferencePool": "p"})
    rows = {name: pod_row(name, "vllm", 3.0, (), ()) for name in ("chat-0", "chat-1")}
    alone = evaluate(rows, (), plain, Aggregation.MAX)
    pooled, _, _ = with_pending(evaluate(rows, (), pooled_spec, Aggregation.MAX), pooled_spec, 0.0, 0.0)
    assert (alone.value, alone.active) == (3.0, False)
    assert (pooled.value, pooled.active) == (3.0, False)
    woken, _, _ = with_pending(evaluate(rows, (), pooled_spec, Aggregation.MAX), pooled_spec, 0.0, 180.0)
    assert woken.active is True  # the busiest pod's 3 plus the 3/s that clear 180 held within the window


def test_token_counters_without_a_value_on_a_page_make_one_missing_pod_not_an_engine_without_them() -> None:
    """`demandUnit: tokens`: a NaN token counter on a pod's newest page is that pod's gap (a missing pod,
    SPEC §4), never "no token counters on its page" for the whole trigger (which is for engines that
    print none); a `demandUnit: requests` read of the same page does not need them."""

    def page(name: str, finished: float, tokens: float | str) -> PodSamples:
        return tokens_pod(name, finished, 0, tokens, tokens)  # type: ignore[arg-type]

    spec = parse_trigger(
        {
            "metric": "demand",
            "threshold": "10",
            "podNamePrefix": "chat-",
            "window": "60",
            "demandUnit": "tokens",
        }
    )
    history = history_of(
        {
            0: [page("chat-0", 0, 0), page("chat-1", 0, 0)],
            30: [page("chat-0", 10, 1000), page("chat-1", 10, 1000)],
            60: [page("chat-0", 20, "NaN"), page("chat-1", 20, 2000)],
        }
    )
    newest = [page("chat-0", 20, "NaN"), page("chat-1", 20, 2000)]
    rows, problems, _ = demand_pod_values(history, newest, spec, 60)
    assert set(rows) == {"chat-1"} and set(problems) == {"chat-0"}, (rows, problems)
    assert "no finite" in problems["chat-0"], problems
    rows, problems, _ = demand_pod_values(history, newest, SPEC, 60)
    assert set(rows) == {"chat-0", "chat-1"} and not problems, (rows, problems)
