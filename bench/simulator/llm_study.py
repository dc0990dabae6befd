"""The LLM simulator's measurements over seeds: a Pareto judge with run-to-run noise, and the sweeps that
choose `demand`'s window, token weight and HPA behaviour."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from bench.simulator.autoscaling import Behavior
from bench.simulator.llm_calibrate import capacity
from bench.simulator.llm_policies import POD_RATE
from bench.simulator.llm_run import LlmRun, run_matrix
from bench.simulator.llm_traces import AGENT, OUTPUT_MEAN, PROMPT_MEAN, RAG, LlmTrace, builtin_traces

TOLERANCE = 0.05  # differences under 5 % of ours are ties, whatever the seeds say
WAIT_FLOOR = 2_000.0  # request-seconds: waiting differences under this are ties (a few requests' worth)
MIXES = {
    "chat (Azure conversation)": (PROMPT_MEAN, OUTPUT_MEAN),
    "RAG": RAG,
    "agent": AGENT,
    "code (Azure code)": (2048.0, 28.0),
    "short chat": (300.0, 300.0),
    "long answers": (1000.0, 1500.0),
}


@dataclass(frozen=True)
class Gap:
    """Theirs − ours over paired seeds (the same arrivals and cold starts): mean and what counts as noise."""

    ours: float  # mean
    theirs: float
    mean: float
    noise: float

    @property
    def ratio(self) -> float:
        """Ours ÷ theirs (1 where both are 0)."""
        if self.theirs == 0:
            return 1.0 if self.ours == 0 else math.inf
        return self.ours / self.theirs

    @property
    def ours_better(self) -> bool:
        return self.mean > self.noise

    @property
    def theirs_better(self) -> bool:
        return -self.mean > self.noise

    @property
    def ours_no_worse(self) -> bool:
        return not self.theirs_better


def gap(ours: list[float], theirs: list[float], floor: float = 0.0) -> Gap:
    """Noise: twice the standard error of the paired differences, at least TOLERANCE of ours and `floor`."""
    differences = [t - o for o, t in zip(ours, theirs, strict=True)]
    mean = statistics.fmean(differences)
    se = statistics.stdev(differences) / math.sqrt(len(differences)) if len(differences) > 1 else 0.0
    ours_mean = statistics.fmean(ours)
    return Gap(ours_mean, statistics.fmean(theirs), mean, max(2 * se, TOLERANCE * ours_mean, floor))


@dataclass(frozen=True)
class Versus:
    gpu: Gap
    waiting: Gap

    @property
    def beaten(self) -> bool:
        """Theirs no worse on both, and better on one by more than the noise (Pareto, with noise)."""
        theirs_no_worse = not self.gpu.ours_better and not self.waiting.ours_better
        return theirs_no_worse and (self.gpu.theirs_better or self.waiting.theirs_better)

    @property
    def beats(self) -> bool:
        return Versus(_swap(self.gpu), _swap(self.waiting)).beaten


def _swap(g: Gap) -> Gap:
    return Gap(g.theirs, g.ours, -g.mean, g.noise)


def versus(ours: list[LlmRun], theirs: list[LlmRun]) -> Versus:
    """Ours against theirs, runs paired by seed."""
    return Versus(
        gap([r.gpu_seconds for r in ours], [r.gpu_seconds for r in theirs]),
        gap(
            [r.waiting_request_seconds for r in ours], [r.waiting_request_seconds for r in theirs], WAIT_FLOOR
        ),
    )


Runs = dict[tuple[str, str], list[LlmRun]]  # (trace, policy) → one run per seed, in seed order


def run_seeds(
    seeds: Iterable[int],
    policies: tuple[str, ...],
    traces: Callable[[int], list[LlmTrace]] | None = None,
    label: str | None = None,
    **options: Any,
) -> Runs:
    """Every policy on every trace for every seed; `label` renames the policy in the keys (for sweeps)."""
    runs: Runs = {}
    for seed in seeds:
        chosen = traces(seed) if traces else builtin_traces(POD_RATE, seed)
        for run in run_matrix(chosen, policies, seed, **options):
            runs.setdefault((run.trace.name, label or run.policy.name), []).append(run)
    return runs


def extend(runs: Runs, more: Runs) -> Runs:
    """More seeds of the same (trace, policy) after the ones already there (never in their place)."""
    for key, added in more.items():
        runs[key] = runs.get(key, []) + added
    return runs


def mean_of(runs: list[LlmRun], key: str) -> float:
    return statistics.fmean(float(r.summary()[key]) for r in runs)


# ---------------------------------------------------------------------------------------------------------
# The choices.


def token_weight_fit(weights: Iterable[float]) -> list[tuple[float, float, dict[str, float]]]:
    """For each weight: the spread (largest ÷ smallest) of one replica's capacity in weighted tokens per
    second across MIXES, and the capacities. Weight ∞ is requests per second."""
    caps = {name: capacity(*mix) for name, mix in MIXES.items()}
    rows = []
    for w in weights:
        per = {name: caps[name] * (w * p + o) for name, (p, o) in MIXES.items()}
        rows.append((w, max(per.values()) / min(per.values()), per))
    return rows


def mix_error(weight: float) -> list[tuple[str, float, float, float]]:
    """Per mix: its capacity in req/s, and how far a threshold calibrated on chat is off on it (threshold ÷
    capacity: above 1 under-provisions), in requests and in weighted tokens."""
    chat = MIXES["chat (Azure conversation)"]
    rows = []
    for name, (p, o) in MIXES.items():
        cap = capacity(p, o)
        by_requests = capacity(*chat) / cap
        by_tokens = capacity(*chat) * (weight * chat[0] + chat[1]) / (cap * (weight * p + o))
        rows.append((name, cap, by_requests, by_tokens))
    return rows


def sweep(seeds: Iterable[int], policy: str, variants: dict[str, dict[str, Any]]) -> Runs:
    """One policy under each named set of options (window, behavior, …), on every trace and seed."""
    runs: Runs = {}
    seeds = list(seeds)
    for label, options in variants.items():
        runs.update(run_seeds(seeds, (policy,), label=label, **options))
    return runs


def behaviors(windows: Iterable[float]) -> dict[str, Behavior]:
    """Scale-up 100 % or 4 pods per 15 s (the HPA's default), scale-down windows to try."""
    return {f"down window {w:g} s": Behavior(down_window=w) for w in windows}
