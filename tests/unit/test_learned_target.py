"""`threshold: auto`'s learner (SPEC §6): each pod's capacity from the load levels it was seen to meet and
fail the latency targets at (never extrapolated), the bounds, the steps, the pace and the hysteresis of the
target's moves, and its bounded memory."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable

import pytest

from keda_gpu_scaler.core.learned_target import (
    FORGET_POD_AFTER,
    MAX_PODS,
    MAX_SAMPLES_PER_POD,
    MIN_MOVE_INTERVAL,
    STEP_DOWN,
    TRY_ABOVE,
    Learner,
    Sample,
)

START = 10.0  # requests per second one replica serves, as the user first guessed
TARGET_TPOT, TARGET_TTFT = 0.050, 2.0


def slow_line(rate: float) -> float:
    """10 ms + 1 ms per request/s: a line through the levels below 14 reaches 50 ms only at 40/s."""
    return 0.010 + 0.001 * rate


def knee_at(knee: float) -> Callable[[float], float]:
    """The time per output token of a pod that saturates at `knee`: slow_line below, 80 ms above."""
    return lambda rate: slow_line(rate) if rate <= knee else 0.080


def windows(
    pod: str,
    rates: Iterable[float],
    per_token: Callable[[float], float] = slow_line,
    first_token: Callable[[float], float | None] = lambda rate: 0.1,
    repeats: int = 4,
    start_time: float = 0.0,
    observations: float = 500.0,
) -> list[Sample]:
    """`repeats` windows of the pod at each rate, 30 s apart (a first token for each request)."""
    rates = [float(rate) for rate in rates for _ in range(repeats)]
    return [
        Sample(
            start_time + 30.0 * i,
            pod,
            rate,
            per_token(rate),
            observations,
            first_token(rate),
            first_token_requests=30.0 * rate,
        )
        for i, rate in enumerate(rates)
    ]


def learned(samples: list[Sample], now: float = 400.0, ready: Iterable[str] | None = None) -> Learner:
    learner = Learner(START, TARGET_TPOT, TARGET_TTFT)
    for sample in samples:
        learner.observe(sample)
    learner.update(now, ready if ready is not None else {s.pod for s in samples})
    return learner


@pytest.mark.parametrize(
    ("name", "samples", "expected"),
    [
        ("no sample yet", [], START),
        ("too few samples", windows("a", [6, 8, 12], repeats=3), START),  # 9 samples
        ("no level seen three times", windows("a", range(2, 14), repeats=2), START),
        ("idle windows only", windows("a", [6, 8, 12, 13], observations=5), START),
        # Every level met: the highest, 12, and TRY_ABOVE more (a line would read 40/s, capped at 20).
        ("never beyond what was seen", windows("a", [4, 8, 12]), 12 * (1 + TRY_ABOVE)),
        ("two pods alike", windows("a", [4, 8, 12]) + windows("b", [4, 8, 12]), 12 * (1 + TRY_ABOVE)),
        # 12 met, 14 missed the time per output token: halfway.
        ("between met and failed", windows("a", [4, 8, 12, 14], knee_at(12.5)), 13.0),
        # The time per token is fine everywhere, but at 14 the first tokens queue: that is saturation.
        (
            "first tokens queueing",
            windows("a", [4, 8, 12, 14], first_token=lambda rate: 1.5 if rate > 13 else 0.1),
            13.0,
        ),
        ("every level failed", windows("a", [9, 12, 14], knee_at(5)), 9 * (1 - STEP_DOWN)),
        ("below the lower bound", windows("a", [2, 3, 4], knee_at(1)), 0.5 * START),
        ("above the upper bound", windows("a", [6, 12, 18]), 2 * START),
    ],
)
def test_target_from_the_samples(name: str, samples: list[Sample], expected: float) -> None:
    assert learned(samples).target == pytest.approx(expected, rel=0.01), name


def test_a_window_without_first_tokens_is_judged_on_the_time_per_token_alone() -> None:
    samples = windows("a", [4, 8, 12, 14], knee_at(12.5), first_token=lambda rate: None)
    assert learned(samples).target == pytest.approx(13.0)


def late_first_tokens(
    late_share: Callable[[float], float], requests: float = 200.0
) -> Callable[[Sample], Sample]:
    """A window whose first tokens came after the TTFT target for `late_share(rate)` of its requests."""
    return lambda s: dataclasses.replace(
        s, first_token_late=late_share(s.rate) * requests, first_token_requests=requests
    )


@pytest.mark.parametrize(
    ("late_above_13", "expected"),
    [
        # Medians well inside the targets everywhere, but at 14 a twentieth and more of the first tokens
        # come late: that level missed what the SLO counts, so the pod serves between 12 and 14.
        (0.08, 13.0),
        # Within the SLO's allowance (5 %) of late first tokens: 14 met, and the pod is trusted above it.
        (0.03, 14 * (1 + TRY_ABOVE)),
    ],
)
def test_a_level_whose_late_first_tokens_pass_the_slos_allowance_missed(
    late_above_13: float, expected: float
) -> None:
    late = late_first_tokens(lambda rate: late_above_13 if rate > 13 else 0.0)
    samples = [late(s) for s in windows("a", [4, 8, 12, 14])]
    learner = learned(samples)
    assert learner.target == pytest.approx(expected, rel=0.01)
    (fit,) = learner.update(400.0, ["a"]).fits
    # /explain says why the level failed.
    assert ("8.0% of its first tokens came after the target, over the 5.0% the SLO allows" in fit.note) == (
        late_above_13 > 0.05
    ), fit.note


@pytest.mark.parametrize(("late_above_13", "expected"), [(0.08, 13.0), (0.03, 14 * (1 + TRY_ABOVE))])
def test_a_level_whose_late_output_tokens_pass_the_slos_allowance_missed(
    late_above_13: float, expected: float
) -> None:
    # The median time per output token is within 50 ms at every level, but at 14 a share of the tokens
    # (of the window's 500) took longer: over the 5 % allowance that level missed.
    samples = [
        dataclasses.replace(s, per_token_late=(late_above_13 if s.rate > 13 else 0.0) * s.observations)
        for s in windows("a", [4, 8, 12, 14])
    ]
    assert learned(samples).target == pytest.approx(expected, rel=0.01)


def test_a_learner_takes_its_allowance_of_late_first_tokens_from_the_slo() -> None:
    late = late_first_tokens(lambda rate: 0.03 if rate > 13 else 0.0)
    learner = Learner(START, TARGET_TPOT, TARGET_TTFT, allowed_misses=0.01)  # sloAttainment 0.99
    for sample in windows("a", [4, 8, 12, 14]):
        learner.observe(late(sample))
    assert learner.update(400.0, ["a"]).target == pytest.approx(13.0)


@pytest.mark.parametrize(("held_windows", "expected"), [(3, 13.0), (2, 14 * (1 + TRY_ABOVE))])
def test_a_level_at_which_the_pool_held_requests_in_most_windows_missed(
    held_windows: int, expected: float
) -> None:
    # Every latency the pod's page shows is inside the targets at 14, but the pool's endpoint pickers held
    # requests at the end of most of that level's windows: no pod had room, the pod was saturated there.
    # Requests then wait at the gateway, which no pod page counts.
    samples = windows("a", [4, 8, 12, 14])
    at_14 = [i for i, s in enumerate(samples) if s.rate == 14]
    for i in at_14[:held_windows]:
        samples[i] = dataclasses.replace(samples[i], pool_held=True)
    learner = learned(samples)
    assert learner.target == pytest.approx(expected, rel=0.01)
    if held_windows == 3:
        (fit,) = learner.update(400.0, ["a"]).fits
        assert "held requests in most of its windows" in fit.note, fit.note


def test_late_first_tokens_that_are_not_a_count_leave_the_window_out() -> None:
    learner = Learner(START, TARGET_TPOT, TARGET_TTFT)
    for bad in (math.nan, -1.0, math.inf):
        learner.observe(Sample(0.0, "a", 5.0, 0.02, 300, 0.1, bad, 100.0))
    assert learner.update(400.0, ["a"]).dropped_invalid == 3


def test_odd_windows_outliers_and_bad_numbers_do_not_decide_a_level() -> None:
    samples = windows("a", [4, 8, 12], repeats=5)
    samples += [Sample(200.0, "a", 12.0, 0.3, 300, 5.0)] * 2  # a stall: two windows in seven at 12
    samples += [Sample(201.0, "a", 15.0, 0.3, 300, 5.0)] * 2  # a burst seen twice only: no level
    samples += [Sample(202.0, "a", 0.1, 2.0, 3), Sample(203.0, "a", 0.2, 1.5, 0)]  # idle: one request
    samples += [Sample(204.0, "a", math.nan, 0.02, 300), Sample(205.0, "a", 5.0, math.inf, 300)]
    samples += [Sample(206.0, "a", 5.0, 0.02, 300, math.nan)]
    learner = Learner(START, TARGET_TPOT, TARGET_TTFT)
    for sample in samples:
        learner.observe(sample)
    answer = learner.update(400.0, ["a"])
    assert answer.target == pytest.approx(12 * (1 + TRY_ABOVE))
    assert (answer.dropped_idle, answer.dropped_invalid) == (2, 3)
    assert answer.samples_used == 19


def test_the_answer_says_why() -> None:
    answer = Learner(START, TARGET_TPOT).update(0.0, ["a"])
    assert (answer.target, answer.proposed, answer.fits) == (START, None, ())
    assert "no sample" in answer.reason

    learner = learned(windows("a", [4, 8, 12, 14], knee_at(12.5)))
    answer = learner.update(400.0, ["a"])
    (fit,) = answer.fits
    assert (fit.met, fit.failed, fit.capacity, fit.levels) == (12.0, 14.0, 13.0, 4)
    assert "lowest above it that failed" in fit.note
    assert (answer.proposed, answer.bound, answer.moved_at) == (13.0, "none", 400.0)
    assert answer.first_token_limit == pytest.approx(1.0)  # half the 2 s target


def test_a_pod_not_ready_does_not_count() -> None:
    samples = windows("ready", [4, 8, 12, 14], knee_at(12.5)) + windows("gone", [4, 8, 18])
    assert learned(samples, ready=("ready",)).target == pytest.approx(13.0)


def test_a_step_under_ten_percent_is_ignored() -> None:
    learner = learned(windows("a", [4, 8, 9]))  # 9 × 1.15: 3.5 % above the start
    assert learner.target == START
    assert "less than the 10% a move needs" in learner.update(400.0, ["a"]).reason


def test_a_small_move_down_from_a_target_the_pods_failed_at_is_taken() -> None:
    # Started at 10: the pod met 8.8 and failed at 9.6, below the target. Its capacity, 9.2, is only 8 %
    # under 10: held by the 10 % step, the target stayed above the load the pod fails at.
    learner = learned(windows("a", [6, 7.5, 8.8, 9.6], knee_at(9.2)))
    answer = learner.update(400.0, ["a"])
    assert learner.target == pytest.approx(9.2) and answer.moved_at == 400.0, answer.reason


def test_a_small_move_down_with_no_failure_at_the_target_is_ignored() -> None:
    learner = learned(windows("a", [6, 7.5, 8.3]))  # every level met: 8.3 + 15 %, 4.5 % under the start
    assert learner.target == START
    assert "less than the 10% a move needs" in learner.update(400.0, ["a"]).reason


def test_at_most_one_move_per_ten_minutes() -> None:
    learner = learned(windows("a", [4, 8, 12, 14], knee_at(12.5)), now=400.0)
    assert learner.target == pytest.approx(13.0)
    # The pod is now seen failing at 8 and above: its capacity drops, but the target just moved.
    for sample in windows("a", [8, 12, 14], knee_at(6), repeats=10, start_time=410.0):
        learner.observe(sample)
    held = learner.update(400.0 + MIN_MOVE_INTERVAL - 1, ["a"])
    assert held.target == pytest.approx(13.0) and "last move" in held.reason
    assert learner.update(400.0 + MIN_MOVE_INTERVAL, ["a"]).target < 13.0


@pytest.mark.parametrize(("highest_met", "moves_back_up"), [(8, False), (9, True)])
def test_a_move_back_up_after_a_failure_needs_a_bigger_change(highest_met: int, moves_back_up: bool) -> None:
    learner = learned(windows("a", [9, 12, 14], knee_at(5)))
    lowered = learner.target  # 8.1: every level failed
    # The pod recovers (a slow neighbour gone): every level met, up to highest_met, and the windows
    # that failed are out of its memory.
    for sample in windows("a", [4, 6, highest_met], repeats=MAX_SAMPLES_PER_POD // 3, start_time=1000.0):
        learner.observe(sample)
    answer = learner.update(2000.0, ["a"])
    proposed = highest_met * (1 + TRY_ABOVE)  # 9.2 (+14 %: held) or 10.35 (+28 %: moves)
    assert answer.proposed == pytest.approx(proposed)
    assert answer.target == pytest.approx(proposed if moves_back_up else lowered)
    assert moves_back_up or "20% a move back up needs" in answer.reason


def test_a_pool_of_two_speeds_is_sized_by_the_mean_capacity() -> None:
    # Two GPU types behind one pool: the fast pods serve 2.2 times as much before they saturate.
    slow = windows("slow-1", [3, 6, 8, 10], knee_at(7)) + windows("slow-2", [3, 6, 8, 10], knee_at(7))
    fast = windows("fast-1", [6, 14, 17], knee_at(15.4)) + windows("fast-2", [6, 14, 17], knee_at(15.4))
    learner = learned(slow + fast)
    answer = learner.update(400.0, {s.pod for s in slow + fast})
    fast_capacity = (14 + 17) / 2  # halfway between what met and what failed
    slow_capacity = 6 * (1 + TRY_ABOVE)  # TRY_ABOVE over what met: under the level that failed
    assert [fit.capacity for fit in answer.fits] == pytest.approx([fast_capacity] * 2 + [slow_capacity] * 2)
    # Sized right: the pool's whole capacity is its number of pods times the target.
    assert learner.target == pytest.approx((fast_capacity + slow_capacity) / 2)
    assert sum(fit.capacity or 0.0 for fit in answer.fits) == pytest.approx(4 * learner.target)


def test_memory_is_bounded_and_pods_gone_are_forgotten() -> None:
    learner = Learner(START, TARGET_TPOT)
    for i in range(5 * MAX_SAMPLES_PER_POD):
        learner.observe(Sample(i / 10, "busy", 2.0 + i % 12, slow_line(2 + i % 12), 500))
    names = [f"pod-{i}" for i in range(MAX_PODS + 5)]
    for i, name in enumerate(names):
        learner.observe(Sample(600.0 + i / 1000, name, 3.0, 0.02, 500))
    answer = learner.update(700.0, ["busy", *names])
    assert len(answer.fits) <= MAX_PODS and all(fit.samples <= MAX_SAMPLES_PER_POD for fit in answer.fits)
    assert "pod-0" not in {fit.pod for fit in answer.fits}  # the stalest made room
    later = learner.update(600.0 + MAX_PODS / 1000 + FORGET_POD_AFTER + 1, ["busy", *names])
    assert later.fits == ()


def test_a_pod_seen_only_at_light_load_says_nothing_about_the_target() -> None:
    # Three pods seen up to 12 (and 14 failing) read 13; a pod added for a burst and then handed the quiet
    # pool's light load met every level it saw, up to 4: under half the target, it is left out of the mean.
    old = [s for pod in ("a", "b", "c") for s in windows(pod, [4, 8, 12, 14], knee_at(12.5))]
    learner = learned(old + windows("new", [2, 3, 4]), ready=["a", "b", "c", "new"])
    answer = learner.update(400.0, ["a", "b", "c", "new"])
    assert answer.mean_capacity == pytest.approx(13.0)  # not (3 × 13 + 4 × 1.15) ÷ 4 = 10.9
    assert learner.target == pytest.approx(13.0)
    new_fit = {fit.pod: fit for fit in answer.fits}["new"]
    assert new_fit.capacity == pytest.approx(4 * (1 + TRY_ABOVE))  # what it read, shown
    assert new_fit.note.startswith("left out: it met only 4")


QUIET_BESIDE = windows("busy", [4, 8, 12, 14], knee_at(12.5))  # alone: met 12, failed 14 → 13


@pytest.mark.parametrize(
    ("why", "late_first_tokens"),
    [("a slow first token in each window's mean", None), ("4 of its 12 first tokens late", 4)],
)
def test_a_nearly_idle_pod_s_first_tokens_are_one_request_s_luck(
    why: str, late_first_tokens: int | None
) -> None:
    # One request of 300 output tokens per 30 s window: 300 token gaps, but one first token. Read as a
    # level that failed, its 0.03/s "capacity" halved a two-pod pool's target (13 → 6.5).
    quiet = [
        Sample(
            30.0 * i,
            "quiet",
            1 / 30,
            0.02,
            300.0,
            0.3 if late_first_tokens else 1.2,
            None if late_first_tokens is None else float(i % 3 == 0),
            1.0,
            0.0,
        )
        for i in range(12)
    ]
    assert learned(QUIET_BESIDE + quiet, ready=["busy", "quiet"]).target == pytest.approx(13.0), why
