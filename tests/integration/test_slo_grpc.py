"""A latency target (SLO) and `threshold: auto` on `metric: demand` (SPEC §6) end to end: loopback vLLM pages
with latency histograms, real gRPC calls, the scaler on a clock the test moves (see test_demand_grpc)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aiohttp
import pytest
from test_demand_grpc import (
    DEMAND,
    MODEL,
    explain,
    fleet,
    ref,
    value,
    vllm_page,
    vllm_page_without_counters,
)

from keda_gpu_scaler.server.evaluator import NO_PUSH

__all__ = ["fleet"]  # the fixture, shared with test_demand_grpc

TTFT_BOUNDS = ("0.25", "0.5", "1", "+Inf")


def page_with_latency(
    finished: float,
    ttft_bucket: str = "0.25",
    tokens: float = 0,
    per_token: float = 0,
    first_token_seconds: float | None = None,
    late: float = 0,
    waiting: float = 0,
) -> str:
    """A vLLM page whose `finished` requests took a first token within `ttft_bucket` (in all
    `first_token_seconds`, else 0.2 s each), but `late` of them only in the +Inf bucket, and whose
    `tokens` output tokens took `per_token` seconds each (running totals)."""
    buckets = [
        f'vllm:time_to_first_token_seconds_bucket{{engine="0",{MODEL},le="{bound}"}}'
        f" {(finished if bound == '+Inf' else finished - late) if TTFT_BOUNDS.index(bound) >= TTFT_BOUNDS.index(ttft_bucket) else 0}"
        for bound in TTFT_BOUNDS
    ]
    return vllm_page(finished, 0, waiting) + "\n".join(
        [
            "# TYPE vllm:time_to_first_token_seconds histogram",
            *buckets,
            f'vllm:time_to_first_token_seconds_sum{{engine="0",{MODEL}}}'
            f" {finished * 0.2 if first_token_seconds is None else first_token_seconds}",
            f'vllm:time_to_first_token_seconds_count{{engine="0",{MODEL}}} {finished}',
            "# TYPE vllm:inter_token_latency_seconds histogram",
            f'vllm:inter_token_latency_seconds_bucket{{engine="0",{MODEL},le="+Inf"}} {tokens}',
            f'vllm:inter_token_latency_seconds_sum{{engine="0",{MODEL}}} {tokens * per_token}',
            f'vllm:inter_token_latency_seconds_count{{engine="0",{MODEL}}} {tokens}',
            "",
        ]
    )


SLO = {**DEMAND, "sloTtftSeconds": "0.5"}


async def test_a_first_token_slower_than_the_slo_raises_the_value_above_the_demand(fleet) -> None:  # type: ignore[no-untyped-def]
    f = await fleet(1)
    f.metadata = SLO
    await f.show(1000, page_with_latency(0, "1"))
    await f.show(1030, page_with_latency(300, "1"))  # 10/s, every first token within 0.5-1 s
    # One pod at 10/s against a threshold of 10: the plain demand is 10; over its target it asks for one more.
    assert await value(f.scaler, SLO) == pytest.approx(20)
    explained = await explain(f.scaler)
    slo = explained["slo"]
    assert slo["target"]["ttftSeconds"] == 0.5 and slo["demand"] == pytest.approx(10)
    assert slo["headroom"].startswith("not measured"), slo
    assert slo["headroomBase"] == pytest.approx(10)  # what a headroom would multiply: the pod's demand
    (read,) = slo["reads"]
    assert read["kind"] == "ttft" and read["quantile"] > 0.5 and read["requests"] == 300
    assert read["podsRead"] == 1 and read["podsWithout"] == [] and read["aboveHighestBound"] is False


async def test_a_first_token_within_the_slo_leaves_the_demand_unchanged(fleet) -> None:  # type: ignore[no-untyped-def]
    f = await fleet(1)
    f.metadata = SLO
    await f.show(1000, page_with_latency(0))
    await f.show(1030, page_with_latency(300))
    assert await value(f.scaler, SLO) == pytest.approx(10)
    assert (await explain(f.scaler))["slo"]["reads"][0]["quantile"] < 0.5


async def test_the_slo_allowance_used_is_counted_from_the_pods_pages_and_shown(fleet) -> None:  # type: ignore[no-untyped-def]
    f = await fleet(1)
    f.metadata = SLO
    await f.show(1000, page_with_latency(0, "1"))
    await f.show(1060, page_with_latency(300, "1"))  # a minute: 300 first tokens, all over 0.5 s
    assert (await explain(f.scaler))["slo"]["budgetUsed"].startswith("not measured")  # nothing counted yet
    # Every request of that minute missed: 20 times the 5 % the SLO allows, counted from the next decision.
    await value(f.scaler, SLO)
    assert (await explain(f.scaler))["slo"]["budgetUsed"] == pytest.approx(1 / 0.05)
    await f.show(1120, page_with_latency(300, "1"))  # a minute without a request: nothing more missed
    await value(f.scaler, SLO)
    assert (await explain(f.scaler))["slo"]["budgetUsed"] == pytest.approx(1 / 0.05)
    # Then minutes of thousands of requests, all within 0.25 s (the 300 stay in their bucket): the share
    # of misses falls.
    for minute, fast in enumerate((10_000, 20_000, 30_000), start=1):
        page = (
            page_with_latency(fast + 300, "0.25")
            .replace(f'le="0.25"}} {fast + 300}', f'le="0.25"}} {fast}')
            .replace(f'le="0.5"}} {fast + 300}', f'le="0.5"}} {fast}')
        )
        await f.show(1120 + 60 * minute, page)
        await value(f.scaler, SLO)
    used = (await explain(f.scaler))["slo"]["budgetUsed"]
    assert 0 < used < 1, used


AUTO = {**DEMAND, "threshold": "auto", "thresholdStart": "10", "window": "30"}


async def learning(fleet, rates: list[float]):  # type: ignore[no-untyped-def]
    """One pod whose time per output token is 10 ms + 2.5 ms per request/s and whose first tokens take
    0.2 s up to 12/s and 1.5 s above (it saturates), at each rate for a window; the fleet after."""
    f = await fleet(1)
    f.metadata = AUTO
    await f.show(1000, page_with_latency(0))
    await learning_more(f, rates)
    return f


async def target(f) -> float:  # type: ignore[no-untyped-def]
    return (await f.scaler.stub.GetMetricSpec(ref(AUTO))).metricSpecs[0].targetSizeFloat


async def test_a_learned_target_moves_from_threshold_start_to_the_capacity_at_the_latency_target(
    fleet,
) -> None:  # type: ignore[no-untyped-def]
    f = await learning(fleet, [])
    stream = f.scaler.stub.StreamMetricSpec(ref(AUTO))
    assert (await stream.read()).metricSpecs[0].targetSizeFloat == 10
    # The time per token meets 50 ms at every level (a line through them reads 16/s), but first tokens
    # queue at 14/s: the capacity is halfway between 12 and 14.
    await learning_more(f, [14, 12, 8, 4] * 4)
    assert await target(f) == pytest.approx(13)
    assert (await stream.read()).metricSpecs[0].targetSizeFloat == pytest.approx(13)
    stream.cancel()
    learned = (await explain(f.scaler))["learnedTarget"]
    assert (
        learned["target"] == pytest.approx(13)
        and learned["bound"] == "none"
        and learned["movedAt"] is not None
    )
    (fit,) = learned["fits"]
    # A sample per window: show() decides once each new page is read.
    assert fit["capacity"] == pytest.approx(13) and fit["samples"] >= 10 and fit["levels"] == 4
    assert (fit["met"], fit["failed"]) == pytest.approx((12, 14))
    assert NO_PUSH not in (await explain(f.scaler)).get("notes", [])
    async with aiohttp.ClientSession() as session, session.get(f"{f.scaler.http}/metrics") as answer:
        text = await answer.text()
    assert (
        'keda_gpu_scaler_learned_target{metric="inference-demand",namespace="llm",scaledobject="chat"} 13'
        in text
    )


async def learning_more(f, rates: list[float], late_share: float = 0.0, queued: float = 1.5) -> None:  # type: ignore[no-untyped-def]
    """learning()'s pod over more windows: 10 ms + 2.5 ms per request/s per token; above 12/s its mean
    first token is `queued` seconds, and above 14/s `late_share` of its first tokens come after every
    finite bucket."""
    await serve_windows(
        f,
        rates,
        per_token=lambda rate: 0.010 + 0.0025 * rate,
        first_token=lambda rate: 0.2 if rate <= 12 else queued,
        late_share=lambda rate: late_share if rate > 14 else 0.0,
    )


async def serve_windows(  # type: ignore[no-untyped-def]
    f,
    rates: list[float],
    per_token: Callable[[float], float] = lambda rate: 0.02,
    first_token: Callable[[float], float] = lambda rate: 0.2,
    late_share: Callable[[float], float] = lambda rate: 0.0,
    waiting: Callable[[float], float] = lambda rate: 0.0,
) -> None:
    """The fleet's pod over one 30 s window per rate, 10 output tokens a request, its page's totals
    counting from its last page before: seconds per output token, mean first token, the share of first
    tokens after every finite bucket, and requests waiting at the window's end, each at the rate."""
    finished = tokens = seconds = first_tokens = late = 0.0
    at = f.clock.now
    for rate in rates:
        at += 30
        finished += rate * 30
        tokens += rate * 30 * 10
        seconds += rate * 30 * 10 * per_token(rate)
        first_tokens += rate * 30 * first_token(rate)
        late += rate * 30 * late_share(rate)
        page = page_with_latency(
            finished,
            tokens=tokens,
            per_token=seconds / tokens,
            first_token_seconds=first_tokens,
            late=late,
            waiting=waiting(rate),
        )
        await f.show(at, page)


@pytest.mark.parametrize(("late_share", "expected"), [(0.0, 16 * 1.15), (0.10, 15.0)])
async def test_a_level_with_more_late_first_tokens_than_the_slo_allows_is_not_met(
    fleet, late_share: float, expected: float
) -> None:  # type: ignore[no-untyped-def]
    # A pod whose mean first token is 0.2 s at every rate (within half the 1 s target), but at 16/s a
    # tenth of its first tokens come after 1 s: more than the 5 % sloAttainment 0.95 allows.
    f = await fleet(1)
    f.metadata = {**AUTO, "sloTtftSeconds": "1", "sloAttainment": "0.95"}
    await f.show(1000, page_with_latency(0))
    await learning_more(f, [16, 14, 8, 4] * 4, late_share=late_share, queued=0.2)
    assert (await f.scaler.stub.GetMetricSpec(ref(f.metadata))).metricSpecs[
        0
    ].targetSizeFloat == pytest.approx(expected)


@pytest.mark.parametrize(("backlog", "expected"), [(30, 15 * 1.15), (0, 15.0)])
async def test_late_first_tokens_of_a_backlog_served_do_not_fail_the_rate_it_was_served_at(
    fleet, backlog: float, expected: float
) -> None:  # type: ignore[no-untyped-def]
    # At its busiest a fifth of the first tokens come late. With `backlog` requests waiting at the start
    # of those windows (piled up at 4/s) and none at their end, the pod was serving what queued before
    # (15/s: 16 less the backlog's 1/s): judged on their medians, met, and the pod is trusted above 15/s.
    # Without a backlog 16/s failed, and the pod serves between 14 and 16. (The pod's capacity: the target
    # moves at most once in 10 minutes, and this is 8.)
    f = await fleet(1)
    f.metadata = {**AUTO, "sloTtftSeconds": "1", "sloAttainment": "0.95"}
    await f.show(1000, page_with_latency(0))
    await serve_windows(
        f,
        [16, 14, 8, 4] * 4,
        late_share=lambda rate: 0.2 if rate == 16 else 0.0,
        waiting=lambda rate: backlog if rate == 4 else 0,
    )
    (fit,) = (await explain(f.scaler))["learnedTarget"]["fits"]
    assert fit["capacity"] == pytest.approx(expected), fit


async def test_a_restarted_pods_histogram_invents_no_late_first_tokens(fleet) -> None:  # type: ignore[no-untyped-def]
    # Before a restart the pod had served 1000 requests, 900 of them with a first token after 1 s (an
    # overloaded pod that then crashed); after it, every first token comes within 0.25 s. Its `le="1"`
    # bucket (100 before) is back above 100 in the first window while `_count` restarted: taken as
    # growth, the difference read as 100 late first tokens and failed the 16/s level.
    f = await fleet(1)
    f.metadata = {**AUTO, "sloTtftSeconds": "1", "sloAttainment": "0.95"}
    await f.show(1000, page_with_latency(1000, tokens=10000, per_token=0.02, late=900))
    await serve_windows(f, [16.1, 14, 8, 4] + [16, 14, 8, 4] * 3)  # 16.1/s: in the 16/s level too
    (fit,) = (await explain(f.scaler))["learnedTarget"]["fits"]
    assert fit["capacity"] == pytest.approx(16 * 1.15), fit["note"]


def ttft_page(finished: float, bounds: dict[str, float]) -> str:
    """A vLLM page whose TTFT histogram has `bounds` (le → the share of `finished` at or below it)."""
    name = "vllm:time_to_first_token_seconds"
    return vllm_page(finished, 0, 0) + "\n".join(
        [
            f"# TYPE {name} histogram",
            *(f'{name}_bucket{{engine="0",{MODEL},le="{le}"}} {finished * s}' for le, s in bounds.items()),
            f'{name}_sum{{engine="0",{MODEL}}} {finished * 1.0}',
            f'{name}_count{{engine="0",{MODEL}}} {finished}',
            "",
        ]
    )


async def test_pods_of_two_engine_builds_with_other_buckets_add_no_pod_when_none_missed(fleet) -> None:  # type: ignore[no-untyped-def]
    # A rolling update: the old build's TTFT buckets (every first token within (1, 2.5] s) and the new
    # one's (every first token within 1 s). None of the 600 first tokens missed 2.5 s; read bound by
    # bound, 2.5 s counted the old pod's only and the guard asked for one pod more (30 for 20).
    old = {"0.5": 0, "1": 0, "2.5": 1, "5": 1, "+Inf": 1}
    new = {"0.5": 0.5, "1": 1, "2": 1, "4": 1, "+Inf": 1}
    slo = {**DEMAND, "sloTtftSeconds": "2.5"}
    f = await fleet(2)
    f.metadata = slo
    await f.show(1000, ttft_page(0, old), ttft_page(0, new))
    await f.show(1030, ttft_page(300, old), ttft_page(300, new))  # 10/s each, against a threshold of 10
    found = await value(f.scaler, slo)
    (read,) = (await explain(f.scaler))["slo"]["reads"]
    assert found == pytest.approx(20), (found, read)
    assert not read["aboveHighestBound"] and read["quantile"] <= 2.5, read


async def test_an_idle_pod_of_another_build_does_not_silence_the_guard(fleet) -> None:  # type: ignore[no-untyped-def]
    # A rolling update: the new build's pod (buckets to 2 s) is Ready but served nothing in the window;
    # the old one's 600 first tokens all took 5-10 s against a 2.5 s target. Cut at the idle pod's 2 s,
    # the p95 read as 2 s, under the target, and the guard added no pod.
    old = {"0.5": 0, "1": 0, "2.5": 0, "5": 0, "10": 1, "+Inf": 1}
    new = {"0.25": 1, "0.5": 1, "1": 1, "2": 1, "+Inf": 1}
    slo = {**DEMAND, "sloTtftSeconds": "2.5"}
    f = await fleet(2)
    f.metadata = slo
    await f.show(1000, ttft_page(0, old), ttft_page(0, new))
    await f.show(1060, ttft_page(600, old), ttft_page(0, new))
    found = await value(f.scaler, slo)  # 10/s over two Ready pods against 10, and one pod more
    (read,) = (await explain(f.scaler))["slo"]["reads"]
    assert read["quantile"] > 2.5 and read["podsRead"] == 2, read
    assert found == pytest.approx(30), (found, read)


def per_output_token_page(finished: float, name: str, observed: float, within_25ms: float) -> str:
    """A vLLM page with one time-per-output-token histogram `name`: `observed` observations, of which
    `within_25ms` took at most 25 ms and the others 50–100 ms (running totals)."""
    return vllm_page(finished, 0, 0) + "\n".join(
        [
            f"# TYPE {name} histogram",
            f'{name}_bucket{{engine="0",{MODEL},le="0.025"}} {within_25ms}',
            f'{name}_bucket{{engine="0",{MODEL},le="0.05"}} {within_25ms}',
            f'{name}_bucket{{engine="0",{MODEL},le="0.1"}} {observed}',
            f'{name}_bucket{{engine="0",{MODEL},le="+Inf"}} {observed}',
            f'{name}_sum{{engine="0",{MODEL}}} {within_25ms * 0.02 + (observed - within_25ms) * 0.08}',
            f'{name}_count{{engine="0",{MODEL}}} {observed}',
            "",
        ]
    )


async def test_per_token_gaps_and_per_request_means_are_never_summed_into_one_read(fleet) -> None:  # type: ignore[no-untyped-def]
    # A rolling update: the old build prints every gap between tokens (10,000 in the window, all within
    # 25 ms), the new one each request's mean (100 requests, every one over the 50 ms target). Summed,
    # they read as a 24 ms quantile with 1 % missed, and the guard added nothing for requests that all
    # missed.
    slo = {**DEMAND, "sloTpotMs": "50"}
    gaps, means = "vllm:inter_token_latency_seconds", "vllm:request_time_per_output_token_seconds"
    f = await fleet(2)
    f.metadata = slo
    await f.show(1000, per_output_token_page(0, gaps, 0, 0), per_output_token_page(0, means, 0, 0))
    await f.show(
        1030, per_output_token_page(300, gaps, 10_000, 10_000), per_output_token_page(300, means, 100, 0)
    )
    found = await value(f.scaler, slo)  # 10/s each against a threshold of 10: 20, and one pod more
    reads = {read["kind"]: read for read in (await explain(f.scaler))["slo"]["reads"]}
    assert found == pytest.approx(30), (found, reads)
    assert reads["tpot"]["requests"] == 100 and reads["tpot"]["quantile"] > 0.05, reads
    assert reads["itl"]["requests"] == 10_000 and reads["itl"]["quantile"] <= 0.025, reads
    assert reads["tpot"]["podsRead"] == reads["itl"]["podsRead"] == 1, reads


async def test_a_pod_without_data_counts_at_the_learned_target_the_hpa_divides_by(fleet) -> None:  # type: ignore[no-untyped-def]
    f = await fleet(2)
    f.metadata = AUTO
    await f.show(1000, page_with_latency(0), vllm_page_without_counters(1, 0))
    await learning_more(f, [14, 12, 8, 4] * 4)
    assert await target(f) == pytest.approx(13)
    # The last window: chat-0 at 4/s; chat-1 has no rate and counts as one replica's worth (SPEC §4): the
    # target the HPA now divides by, not thresholdStart (13/10 more replicas at every sync while pods start).
    answered = await value(f.scaler, AUTO)
    # That call may move the target once more (a window read under load can add a level): what counts is
    # the target after it, the one the HPA divides by.
    learned = await target(f)
    assert learned != 10 and answered == pytest.approx(4 + learned)


async def test_too_few_samples_keep_threshold_start(fleet) -> None:  # type: ignore[no-untyped-def]
    f = await learning(fleet, [2, 4, 6, 8])
    assert await target(f) == 10
    learned = (await explain(f.scaler))["learnedTarget"]
    assert learned["target"] == 10 and "no Ready pod has a usable fit" in learned["reason"]
    assert "too few samples" in learned["fits"][0]["note"]


async def test_an_auto_target_without_a_spec_stream_is_warned_about_once(fleet, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.WARNING, logger="keda_gpu_scaler.server.registry")
    f = await learning(fleet, [2, 4, 6])  # 90 s followed, no StreamMetricSpec stream
    await value(f.scaler, AUTO)
    warned = [r for r in caplog.records if NO_PUSH in r.getMessage()]
    assert len(warned) == 1, warned
    assert NO_PUSH in (await explain(f.scaler))["notes"]


# The usual second trigger (SPEC §6/§7): a `requests` saturation guard, as `external-push`.
GUARD = {"metric": "requests", "threshold": "50", "podNamePrefix": "chat-"}


async def test_a_stream_of_another_trigger_does_not_silence_the_no_push_warning(fleet, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.WARNING, logger="keda_gpu_scaler.server.registry")
    f = await fleet(1)
    guard_stream = f.scaler.stub.StreamMetricSpec(
        ref(GUARD)
    )  # KEDA: StreamMetricSpec for the push trigger only
    first = await asyncio.wait_for(guard_stream.read(), 10)
    assert [s.metricName for s in first.metricSpecs] == [
        "inference-requests"
    ]  # the guard's specs, not AUTO's
    f.metadata = AUTO  # the auto trigger, plain `external`: polled only, 90 s followed
    await f.show(1000, page_with_latency(0))
    await learning_more(f, [2, 4, 6])
    await value(f.scaler, AUTO)
    explanation = next(e for e in f.scaler.app.explanations("llm", "chat") if e.spec.learned)
    guard_open = f.scaler.app.registry.get("llm", "chat").spec_streams
    assert NO_PUSH in explanation.notes, (
        f"no warning while only the guard's spec stream is open ({guard_open})"
    )
    assert len([r for r in caplog.records if NO_PUSH in r.getMessage()]) == 1
    guard_stream.cancel()
