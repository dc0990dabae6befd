"""`threshold: auto`'s learner (SPEC §6): each pod's capacity at the latency target, the bounds, the steps,
the pace and the hysteresis of the target's moves, and its bounded memory."""

from __future__ import annotations

import math
import random

import pytest

from keda_gpu_scaler.core.learned_target import (
    FORGET_POD_AFTER,
    MAX_PODS,
    MAX_SAMPLES_PER_POD,
    MIN_MOVE_INTERVAL,
    Learner,
    Sample,
)

START = 10.0  # requests per second one replica serves, as the user first guessed
TARGET_TPOT = 0.050
# The slow pods' line: 10 ms + 3 ms per request per second, so 50 ms is reached at 13.3 requests/s.
INTERCEPT, SLOPE = 0.010, 0.003
SLOW_CAPACITY = (TARGET_TPOT - INTERCEPT) / SLOPE


def line_samples(
    pod: str,
    slope: float = SLOPE,
    rates: range = range(2, 14),
    start_time: float = 0.0,
    observations: float = 500.0,
) -> list[Sample]:
    """One sample per load level, each exactly on the pod's line."""
    return [
        Sample(start_time + 30.0 * i, pod, float(rate), INTERCEPT + slope * rate, observations)
        for i, rate in enumerate(rates)
    ]


def learned(samples: list[Sample], now: float = 400.0, ready: tuple[str, ...] | None = None) -> Learner:
    learner = Learner(START, TARGET_TPOT)
    for sample in samples:
        learner.observe(sample)
    learner.update(now, ready if ready is not None else {s.pod for s in samples})
    return learner


@pytest.mark.parametrize(
    ("name", "samples", "expected"),
    [
        ("no sample yet", [], START),
        ("too few samples", line_samples("a", rates=range(2, 11)), START),  # 9 samples
        ("too few load levels", [*line_samples("a", rates=range(4, 6))] * 6, START),  # 12 over 2 levels
        ("a clean line", line_samples("a"), SLOW_CAPACITY),
        ("two pods on one line", line_samples("a") + line_samples("b"), SLOW_CAPACITY),
        ("idle windows only", line_samples("a", observations=5), START),
        ("latency flat with load", [Sample(i, "a", 2.0 + i, 0.02, 500) for i in range(12)], START),
        ("above the upper bound", line_samples("a", slope=SLOPE / 4), 2 * START),
        ("below the lower bound", line_samples("a", slope=SLOPE * 4), 0.5 * START),
    ],
)
def test_target_from_the_samples(name: str, samples: list[Sample], expected: float) -> None:
    assert learned(samples).target == pytest.approx(expected, rel=0.01), name


def test_noise_outliers_idle_windows_and_bad_numbers_leave_the_capacity_within_ten_percent() -> None:
    rng = random.Random(7)
    samples = []
    for i in range(MAX_SAMPLES_PER_POD):
        rate = rng.uniform(1.0, 14.0)
        latency = (INTERCEPT + SLOPE * rate) * rng.uniform(0.9, 1.1)
        if i % 10 == 0:
            latency *= 5  # a stall: one window in ten is far off the line
        samples.append(Sample(3.0 * i, "a", rate, latency, 300))
    samples += [Sample(200.0, "a", 0.1, 2.0, 3), Sample(201.0, "a", 0.2, 1.5, 0)]  # idle: one slow request
    samples += [Sample(202.0, "a", math.nan, 0.02, 300), Sample(203.0, "a", 5.0, math.inf, 300)]
    learner = Learner(START, TARGET_TPOT)
    for sample in samples:
        learner.observe(sample)
    answer = learner.update(400.0, ["a"])
    assert answer.target == pytest.approx(SLOW_CAPACITY, rel=0.10)
    assert (answer.dropped_idle, answer.dropped_invalid) == (2, 2)
    assert answer.samples_used == MAX_SAMPLES_PER_POD


def test_the_answer_says_why() -> None:
    answer = Learner(START, TARGET_TPOT).update(0.0, ["a"])
    assert (answer.target, answer.proposed, answer.fits) == (START, None, ())
    assert "no sample" in answer.reason

    learner = learned(line_samples("a", slope=SLOPE / 4))
    answer = learner.update(400.0, ["a"])
    (fit,) = answer.fits
    assert (fit.intercept, fit.slope) == pytest.approx((INTERCEPT, SLOPE / 4))
    assert answer.mean_capacity == pytest.approx(4 * SLOW_CAPACITY)
    assert (answer.proposed, answer.bound, answer.moved_at) == (2 * START, "upper", 400.0)


def test_a_pod_not_ready_does_not_count() -> None:
    samples = line_samples("ready") + line_samples("gone", slope=SLOPE / 4)
    assert learned(samples, ready=("ready",)).target == pytest.approx(SLOW_CAPACITY)


def test_a_step_under_ten_percent_is_ignored() -> None:
    # 10.8 requests/s at 50 ms: 8 % above the start.
    slope = (TARGET_TPOT - INTERCEPT) / (1.08 * START)
    learner = learned(line_samples("a", slope=slope))
    assert learner.target == START
    assert "less than the 10% a move needs" in learner.update(400.0, ["a"]).reason


def test_at_most_one_move_per_five_minutes() -> None:
    learner = learned(line_samples("a"), now=400.0)
    assert learner.target == pytest.approx(SLOW_CAPACITY)
    # The pod slows down: its capacity halves, but the target just moved.
    for sample in line_samples("a", slope=2 * SLOPE, start_time=410.0) * 10:
        learner.observe(sample)
    held = learner.update(400.0 + MIN_MOVE_INTERVAL - 1, ["a"])
    assert held.target == pytest.approx(SLOW_CAPACITY) and "last move" in held.reason
    assert learner.update(400.0 + MIN_MOVE_INTERVAL, ["a"]).target < SLOW_CAPACITY


@pytest.mark.parametrize(
    ("capacity_after", "moves_back"),
    [(0.87, False), (0.75, True)],  # 13 % down: a move back needs 20 %; 25 % down: it moves
)
def test_a_move_back_needs_a_bigger_change(capacity_after: float, moves_back: bool) -> None:
    learner = learned(line_samples("a"), now=400.0)
    moved = learner.target
    slope = (TARGET_TPOT - INTERCEPT) / (capacity_after * moved)
    for sample in line_samples("a", slope=slope, start_time=1000.0) * 10:  # outnumbers the old line
        learner.observe(sample)
    answer = learner.update(2000.0, ["a"])
    assert (answer.target != moved) is moves_back
    assert answer.proposed == pytest.approx(capacity_after * moved)


def test_a_pool_of_two_speeds_is_sized_by_the_mean_capacity() -> None:
    # Two GPU types behind one pool: the fast pods serve 2.2 times as much at the same latency.
    slow_capacity, fast_capacity = 8.0, 2.2 * 8.0
    slow_slope = (TARGET_TPOT - INTERCEPT) / slow_capacity
    fast_slope = (TARGET_TPOT - INTERCEPT) / fast_capacity
    pods = {"slow-1": slow_slope, "slow-2": slow_slope, "fast-1": fast_slope, "fast-2": fast_slope}
    samples = [sample for pod, slope in pods.items() for sample in line_samples(pod, slope=slope)]
    learner = learned(samples)
    expected_mean = (slow_capacity + fast_capacity) / 2  # 12.8 requests/s
    assert learner.target == pytest.approx(expected_mean)
    # Sized right: the pool's whole capacity is its number of pods times the target.
    answer = learner.update(400.0, pods)
    assert sum(fit.capacity or 0.0 for fit in answer.fits) == pytest.approx(len(pods) * learner.target)


def test_memory_is_bounded_and_pods_gone_are_forgotten() -> None:
    learner = Learner(START, TARGET_TPOT)
    for i in range(5 * MAX_SAMPLES_PER_POD):
        learner.observe(Sample(float(i), "busy", 2.0 + i % 12, INTERCEPT + SLOPE * (2 + i % 12), 500))
    names = [f"pod-{i}" for i in range(MAX_PODS + 5)]
    for i, name in enumerate(names):
        learner.observe(Sample(600.0 + i / 1000, name, 3.0, 0.02, 500))
    answer = learner.update(700.0, ["busy", *names])
    assert len(answer.fits) <= MAX_PODS and all(fit.samples <= MAX_SAMPLES_PER_POD for fit in answer.fits)
    assert "pod-0" not in {fit.pod for fit in answer.fits}  # the stalest made room
    later = learner.update(600.0 + MAX_PODS / 1000 + FORGET_POD_AFTER + 1, ["busy", *names])
    assert later.fits == ()
