"""What one replica serves at a latency target, per request mix: the measurement a user makes with a load
ramp against one pod (and the `demand` threshold the README tells them to pick), done on the model."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from bench.simulator.llm_fleet import Fleet, Request, ServerModel
from bench.simulator.llm_traces import LlmTrace, Segment, draw_arrivals

TPOT_TARGET_MS = 20.0  # the latency target: mean milliseconds per output token (a chat service's)
WAIT_TARGET = 0.5  # … and requests do not wait for a batch slot: p95 wait under half a second
CALIBRATION_SEED = 7
STEP = 0.25


@dataclass(frozen=True)
class PodPoint:
    """One pod at a constant arrival rate, after warming up: what a load ramp would measure."""

    rate: float
    served: float  # requests completed per second
    in_flight: float
    kv: float
    ms_per_token: float
    p95_wait: float
    utilization: float  # % of the time the GPU had work
    weighted: dict[float, float]  # token weight → weighted tokens taken on per second


def pod_point(
    rate: float,
    prompt_mean: float,
    output_mean: float,
    model: ServerModel | None = None,
    seconds: float = 900.0,
    warm: float = 300.0,
    seed: int = CALIBRATION_SEED,
    weights: tuple[float, ...] = (),
) -> PodPoint:
    model = model or ServerModel()
    trace = LlmTrace("pod", "", (Segment(0.0, rate, prompt_mean, output_mean),), seconds)
    arrivals = draw_arrivals(trace, seed)
    fleet = Fleet(model, 1, 0.0)
    pod = fleet.pods[0]
    index, in_flight, kv, samples = 0, 0.0, 0.0, 0
    mark = (0, 0.0, 0.0, 0, 0.0, 0, 0)
    for step in range(1, round(seconds / STEP) + 1):
        now = step * STEP
        fleet.step(now, STEP)
        while index < len(arrivals.times) and arrivals.times[index] < now + STEP:
            fleet.arrive(Request(arrivals.times[index], arrivals.prompts[index], arrivals.outputs[index]))
            index += 1
        tally = fleet.tally
        if now == warm:
            mark = (
                tally.completed,
                pod.busy,
                tally.decode_seconds,
                tally.decode_tokens,
                pod.generation_tokens,
                pod.prompt_tokens,
                len(tally.waits),
            )
        if now > warm:
            in_flight += fleet.in_system()
            kv += pod.kv_usage()
            samples += 1
    tally, span = fleet.tally, seconds - warm
    completed, busy, decode_s, decode_t, gen, prompt, waits_at = mark
    tokens = tally.decode_tokens - decode_t
    waits = sorted(tally.waits[waits_at:]) or [0.0]
    gen_rate = (pod.generation_tokens - gen) / span
    prompt_rate = (pod.prompt_tokens - prompt) / span
    return PodPoint(
        rate,
        (tally.completed - completed) / span,
        in_flight / samples,
        kv / samples,
        1000 * (tally.decode_seconds - decode_s) / tokens if tokens else 0.0,
        waits[max(0, math.ceil(0.95 * len(waits)) - 1)],
        100 * (pod.busy - busy) / span,
        {w: w * prompt_rate + gen_rate for w in weights},
    )


def meets(point: PodPoint) -> bool:
    return point.ms_per_token <= TPOT_TARGET_MS and point.p95_wait <= WAIT_TARGET


# Capacities worked out elsewhere (the judge's calibration, handed to its workers as they start).
KNOWN: dict[tuple[float, float, ServerModel | None], float] = {}


@functools.lru_cache(maxsize=64)
def capacity(prompt_mean: float, output_mean: float, model: ServerModel | None = None) -> float:
    """The highest arrival rate (req/s, to 0.05) at which one pod meets the latency target: the load
    ramp's answer, and the per-replica threshold of `demand` for this mix."""
    if (known := KNOWN.get((prompt_mean, output_mean, model))) is not None:
        return known
    low, high = 0.05, 40.0
    while high - low > 0.05:
        middle = (low + high) / 2
        if meets(pod_point(middle, prompt_mean, output_mean, model)):
            low = middle
        else:
            high = middle
    return round(low, 2)


def token_capacity(
    prompt_mean: float, output_mean: float, weight: float, model: ServerModel | None = None
) -> float:
    """The same operating point in weighted tokens per second (prompt tokens × weight + output tokens)."""
    return capacity(prompt_mean, output_mean, model) * (weight * prompt_mean + output_mean)
