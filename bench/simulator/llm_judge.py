"""The SLO judge: what each policy costs to meet the SLO on one trace, every policy's knobs searched alike.

For each policy, every setting of a small grid (its thresholds or targets scaled together, and the HPA's
scale-down window) runs through the same arrivals, cold starts, loop phases and pod disruptions; the
policy's answer is its cheapest setting that meets the SLO, or its highest-attainment one when none does.
`recommended` is the README's configuration at the README's settings, not searched; `recommended-tuned` is
it with its demand threshold searched (a hand-tuned threshold: × the simulator's calibrated threshold), and
`recommended-auto` is it with `threshold: auto` from `thresholdStart` = F × the calibrated threshold
(`--start-threshold-scale F`), not searched.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Iterable
from typing import Any

from bench.simulator.autoscaling import Behavior
from bench.simulator.llm_calibrate import KNOWN, capacity
from bench.simulator.llm_fleet import ServerModel
from bench.simulator.llm_policies import (
    POD_RATE,
    DemandTrigger,
    LlmPolicy,
    PendingTrigger,
    ProductTrigger,
    ScalerTrigger,
    SloSignal,
    make_policy,
)
from bench.simulator.llm_product import POOL
from bench.simulator.llm_run import Realism, Slo, forked_workers, simulate_llm
from bench.simulator.llm_traces import OUTPUT_MEAN, PROMPT_MEAN, Arrivals, LlmTrace, draw_arrivals
from keda_gpu_scaler.core.recommended import SIZING, WAKE

JUDGED = (
    "demand-tokens+pending",
    "requests",
    "prometheus-requests",
    "llm-d-epp",
    "llm-d-queue-guard",
    "llm-d-slo",
    "oracle",
    "clairvoyant",
)
# The README's LLM ScaledObject: `demand` in tokens with inferencePool (its window, weight and threshold)
# stating the user's SLO (the judge's targets and attainment), a `requests` guard at 64 per pod, a
# `pending` wake (`core.recommended.WAKE`, 64) on the pool, and manifests/components/llm-hpa-behavior: scale-down window 120 s,
# then at most half the pods a minute; at minReplicaCount 0, the README's cooldownPeriod.
RECOMMENDED = "demand-tokens+pending"
README_THRESHOLD = float(dict(SIZING.metadata)["threshold"])  # weighted tokens/s (the calibration: 15,313)
README_GUARD = 64.0
README_WAKE = float(dict(WAKE.metadata)["threshold"])  # requests held at the gateway per replica
README_BEHAVIOR = Behavior(down_window=120.0, down_percent=50.0, down_period=60.0)
README_COOLDOWN = 600.0  # s: the README's scale-to-zero ScaledObject's cooldownPeriod (idle before 0)
# × every threshold or target of the policy (higher: fewer replicas), in steps of about √2 around its default: wide
# enough that a recipe whose default target sits far from this model's pod (llm-d's 16 running requests
# against the 50 a pod holds at its latency target) can reach its own cheapest setting.
SCALES = (0.5, 0.7, 1.0, 1.4, 2.0, 2.8)
DOWN_WINDOWS = (60.0, 120.0, 300.0)  # s: the HPA's scale-down stabilisation window
# The clairvoyant's own knob: how far on it looks, a mean start on a warm node or the longest start (on a
# node provisioned first). Either alone is no lower bound: looking 75 s on, the pods a step needs that
# wait for a node come minutes late, and only twice the fleet met the SLO (31.6k GPU-s on `step`, where
# prometheus-requests met it at 20.7k); looking 385 s on holds pods early wherever the mix churns.
CLAIRVOYANT = "clairvoyant"
# The README's configuration with `threshold: auto`, and with its demand threshold hand-tuned: × each of
# TUNED_SCALES (finer than SCALES: the learned target is held to the cheapest of these).
AUTO = "recommended-auto"
TUNED = "recommended-tuned"
TUNED_SCALES = (0.8, 1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.4)
JUDGE_ONLY = (AUTO, TUNED)


Mix = tuple[float, float, ServerModel | None]  # (prompt mean, output mean, the model or the default)


@dataclasses.dataclass(frozen=True)
class Job:
    trace: LlmTrace
    policy: str
    scale: float | None  # None: the policy as configured (recommended); recommended-auto: F
    down_window: float | None
    seed: int
    min_replicas: int | None
    model: ServerModel
    slo: Slo
    realism: Realism
    lookahead: float | None = None  # the clairvoyant's (None: its default)


def configured(job: Job) -> LlmPolicy:
    if job.policy in ("recommended", *JUDGE_ONLY):
        policy = make_policy(RECOMMENDED, job.min_replicas, behavior=README_BEHAVIOR)
        demand = policy.triggers[0]
        assert isinstance(demand, DemandTrigger)
        demand.metadata |= job.slo.metadata()
        # `recommended` at the README's threshold; the tuned and learned ones from the calibration's.
        if job.policy == TUNED:
            demand.threshold *= job.scale or 1.0
        elif job.policy == AUTO:
            demand.learn(demand.threshold * (job.scale or 1.0))
        else:
            demand.threshold = README_THRESHOLD
        if job.policy != AUTO:
            demand.metadata["threshold"] = f"{demand.threshold!r}"
        guard = ScalerTrigger("requests", README_GUARD)
        # It acts while the pool holds requests or the requests miss the SLO.
        guard.metadata |= {"inferencePool": POOL, **job.slo.metadata()}
        policy.triggers.append(guard)
        # The wake, `pending` on the pool: it pushes (StreamIsActive) and is one of the HPA's metrics too,
        # which takes the largest of the three, as KEDA's HPA does.
        wake = PendingTrigger(README_WAKE)
        policy.push = wake
        policy.triggers.append(wake)
        policy.cooldown = README_COOLDOWN
        policy.name = job.policy
        return policy
    policy = make_policy(
        job.policy, job.min_replicas, trace=job.trace, model=job.model, lookahead=job.lookahead
    )
    if job.scale is not None:
        for trigger in policy.triggers:
            if isinstance(trigger, SloSignal):
                trigger.up, trigger.down = trigger.up * job.scale, trigger.down * job.scale
            else:
                trigger.threshold *= job.scale
                if isinstance(trigger, ProductTrigger):  # the ScaledObject's threshold is the HPA's target
                    trigger.metadata["threshold"] = f"{trigger.threshold!r}"
    if job.down_window is not None:
        policy.behavior = dataclasses.replace(policy.behavior, down_window=job.down_window)
    policy.name = job.policy
    return policy


@functools.lru_cache(maxsize=2)
def _arrivals(trace: LlmTrace, seed: int) -> Arrivals:
    return draw_arrivals(trace, seed)


def run_job(job: Job) -> dict[str, Any]:
    policy = configured(job)
    run = simulate_llm(
        job.trace, _arrivals(job.trace, job.seed), policy, POD_RATE, job.model,
        seed=job.seed, realism=job.realism, slo=job.slo,
    )  # fmt: skip
    setting = {"threshold_scale": job.scale, "down_window_seconds": policy.behavior.down_window}
    if job.lookahead is not None:
        setting["lookahead_seconds"] = job.lookahead
    return run.summary() | {"setting": setting, "disruptions": run.disruptions} | _learned(policy, job)


def _learned(policy: LlmPolicy, job: Job) -> dict[str, Any]:
    """A learned target's record: where it started, each move the HPA received, and moves per hour."""
    if job.policy != AUTO:
        return {}
    demand = policy.triggers[0]
    assert isinstance(demand, ProductTrigger)
    changes = demand.target_changes
    return {
        "threshold_start": float(demand.metadata["thresholdStart"]),
        "learned_target": demand.threshold,
        "target_changes": [(round(at), round(target, 1)) for at, target in changes],
        "target_changes_per_hour": round(len(changes) / (job.trace.duration / 3600), 2),
    }


def choose(rows: Iterable[dict[str, Any]], goal: float) -> dict[str, Any]:
    """The cheapest row (GPU-seconds) whose attainment reaches `goal`; when none does, the row with the
    highest attainment (the cheaper on a tie). The row gains `meets_slo`."""
    rows = list(rows)
    meeting = [r for r in rows if r["slo_attainment"] >= goal]
    if meeting:
        best = min(meeting, key=lambda r: (r["gpu_seconds"], -r["slo_attainment"]))
    else:
        best = max(rows, key=lambda r: (r["slo_attainment"], -r["gpu_seconds"]))
    return best | {"meets_slo": best["slo_attainment"] >= goal}


def jobs(
    trace: LlmTrace, policies: Iterable[str], seed: int, min_replicas: int | None, model: ServerModel,
    slo: Slo, realism: Realism, start_scale: float = 1.0,
) -> list[Job]:  # fmt: skip
    policies = tuple(policies)
    searched = [name for name in policies if name not in JUDGE_ONLY]
    settings = [
        *itertools.product(searched, SCALES, DOWN_WINDOWS),
        *((TUNED, scale, None) for scale in TUNED_SCALES if TUNED in policies),
        *([(AUTO, start_scale, None)] if AUTO in policies else []),
        ("recommended", None, None),
    ]
    lookaheads = {CLAIRVOYANT: (model.cold_start, model.longest_start)}
    return [
        Job(trace, name, scale, window, seed, min_replicas, model, slo, realism, ahead)
        for name, scale, window in settings
        for ahead in lookaheads.get(name, (None,))
    ]


def judge(
    trace: LlmTrace,
    seed: int,
    slo: Slo,
    goal: float,
    min_replicas: int | None = None,
    model: ServerModel | None = None,
    policies: Iterable[str] = JUDGED,
    realism: Realism | None = None,
    processes: int = 2,
    start_scale: float = 1.0,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(one chosen row per policy and `recommended`, every row of the search); `start_scale`:
    recommended-auto's thresholdStart ÷ the calibrated threshold."""
    slo = dataclasses.replace(slo, attainment=goal)  # what `recommended` states, as a user would
    model, realism = model or ServerModel(), realism or Realism()
    work = jobs(trace, policies, seed, min_replicas, model, slo, realism, start_scale)
    if processes > 1:
        KNOWN.update(_calibrations(trace, model, processes))
        rows = _run_longest_first(work, processes)
    else:
        rows = [run_job(job) for job in work]
    by_policy: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_policy.setdefault(row["policy"], []).append(row)
    return [choose(found, goal) for found in by_policy.values()], rows


def _run_longest_first(work: list[Job], processes: int) -> list[dict[str, Any]]:
    """Every job's row, in `work`'s order; the runs that ask the product (the longest) start first, so no
    worker is left idle while the other finishes a long run at the end."""
    order = sorted(range(len(work)), key=lambda i: not _asks_product(work[i]))
    with forked_workers(processes) as pool:
        done = pool.map(run_job, [work[i] for i in order], chunksize=1)
    rows: list[dict[str, Any]] = [{}] * len(work)
    for i, row in zip(order, done, strict=True):
        rows[i] = row
    return rows


def _asks_product(job: Job) -> bool:
    return any(isinstance(trigger, ProductTrigger) for trigger in configured(job).triggers)


def _calibrations(trace: LlmTrace, model: ServerModel, processes: int) -> dict[Mix, float]:
    """Each mix's capacity, worked out once on `processes` workers side by side; every run reads them
    (the workers of the runs are forked after, and inherit them)."""
    mixes = {(PROMPT_MEAN, OUTPUT_MEAN)} | {(s.prompt_mean, s.output_mean) for s in trace.segments}
    keys: list[Mix] = [(*mix, with_model) for mix in sorted(mixes) for with_model in (model, None)]
    with forked_workers(processes) as pool:
        return dict(zip(keys, pool.starmap(capacity, keys, chunksize=1), strict=True))


def frontier(rows: Iterable[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """Per policy, its settings that no other of its settings beats on both GPU-seconds and attainment:
    (GPU-seconds, attainment), cheapest first."""
    points: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        points.setdefault(row["policy"], []).append((row["gpu_seconds"], row["slo_attainment"]))
    lines = {}
    for policy, found in points.items():
        line: list[tuple[float, float]] = []
        for gpu, attained in sorted(found, key=lambda p: (p[0], -p[1])):
            if not line or attained > line[-1][1]:
                line.append((gpu, attained))
        lines[policy] = line
    return lines
