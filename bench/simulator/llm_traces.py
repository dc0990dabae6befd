"""Request traces for the LLM fleet: a rate (and token means) piecewise constant in time, and the arrivals
drawn from it: Poisson at the segment's rate, prompt and output tokens log-normal with the segment's means.

Built-in: step, spike, diurnal with quiet nights, bursty (a two-state Markov-modulated Poisson process);
any other from a CSV file with header `seconds,requests_per_second[,prompt_tokens,output_tokens]`.
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass
from pathlib import Path

# Azure LLM inference trace 2023, conversation: prompt mean 1,155 / median 1,020 tokens, output mean 211 /
# median 129. A log-normal with that mean and median has σ² = 2 ln(mean / median).
PROMPT_MEAN = 1155.0
OUTPUT_MEAN = 211.0
PROMPT_SIGMA = math.sqrt(2 * math.log(1155 / 1020))
OUTPUT_SIGMA = math.sqrt(2 * math.log(211 / 129))
MAX_TOKENS = 32_768  # one request's prompt or output, at most (a tail draw beyond is cut here)
QUIET_SECONDS = 300.0  # a stretch with no arrivals at least this long is a quiet period (KEDA's cooldown)

HEADER = ("seconds", "requests_per_second")
HEADER_WITH_TOKENS = (*HEADER, "prompt_tokens", "output_tokens")


@dataclass(frozen=True)
class Segment:
    start: float
    rate: float  # requests per second
    prompt_mean: float = PROMPT_MEAN
    output_mean: float = OUTPUT_MEAN


@dataclass(frozen=True)
class LlmTrace:
    name: str
    description: str
    segments: tuple[Segment, ...]
    duration: float

    def rate_at(self, t: float) -> float:
        rate = 0.0
        for segment in self.segments:
            if segment.start > t:
                break
            rate = segment.rate
        return rate

    def quiet_ends(self) -> list[float]:
        """Where each stretch of rate 0 lasting at least QUIET_SECONDS ends (the next request wakes the fleet)."""
        ends = []
        quiet_since: float | None = None
        for segment in self.segments:
            if segment.rate == 0:
                quiet_since = segment.start if quiet_since is None else quiet_since
            elif quiet_since is not None:
                if segment.start - quiet_since >= QUIET_SECONDS:
                    ends.append(segment.start)
                quiet_since = None
        return ends


@dataclass(frozen=True)
class Arrivals:
    """The requests of one trace, drawn once and replayed identically under every policy."""

    times: list[float]
    prompts: list[int]
    outputs: list[int]


def _lognormal(rng: random.Random, mean: float, sigma: float) -> int:
    mu = math.log(mean) - sigma * sigma / 2
    return max(1, min(MAX_TOKENS, round(rng.lognormvariate(mu, sigma))))


def draw_arrivals(trace: LlmTrace, seed: int) -> Arrivals:
    rng = random.Random(seed)
    times: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    bounds = [s.start for s in trace.segments[1:]] + [trace.duration]
    for segment, end in zip(trace.segments, bounds, strict=True):
        if segment.rate <= 0:
            continue
        # Poisson arrivals are memoryless: restarting the exponential gaps at each segment is exact.
        t = segment.start + rng.expovariate(segment.rate)
        while t < end:
            times.append(t)
            prompts.append(_lognormal(rng, segment.prompt_mean, PROMPT_SIGMA))
            outputs.append(_lognormal(rng, segment.output_mean, OUTPUT_SIGMA))
            t += rng.expovariate(segment.rate)
    return Arrivals(times, prompts, outputs)


# ---------------------------------------------------------------------------------------------------------
# Built-in traces; `unit` is the rate one pod serves at the `requests` target (llm_policies.REQUESTS_TARGET).


def step_trace(unit: float) -> LlmTrace:
    low, high = 1.5 * unit, 6 * unit
    segments = (Segment(0, low), Segment(600, high), Segment(2400, low))
    return LlmTrace("step", f"{low:.0f} → {high:.0f} req/s at 10 min, back at 40 min", segments, 3600.0)


def spike_trace(unit: float) -> LlmTrace:
    base, peak = 2 * unit, 8 * unit
    segments = (Segment(0, base), Segment(900, peak), Segment(1020, base))
    return LlmTrace("spike", f"{base:.0f} req/s, 2 minutes at {peak:.0f} from 15 min", segments, 2400.0)


def diurnal_trace(unit: float) -> LlmTrace:
    """A day compressed into 70 minutes between quiet nights, then a few late requests in the night."""
    peak = 6 * unit
    segments = [Segment(0, 0.0)]
    for minute in range(10, 70):
        phase = (minute - 10 + 0.5) / 60
        segments.append(Segment(minute * 60.0, round(peak * math.sin(math.pi * phase) ** 2 + 0.05, 3)))
    segments += [Segment(4200, 0.0), Segment(6000, 0.2), Segment(6120, 0.0)]
    return LlmTrace(
        "diurnal",
        f"quiet 10 min, a day up to {peak:.0f} req/s over 60 min, quiet 30 min, 0.2 req/s for 2 min, quiet",
        tuple(segments),
        7200.0,
    )


def bursty_trace(unit: float, seed: int) -> LlmTrace:
    """Markov-modulated Poisson: calm and burst states with exponential dwell times (mean 240 s and 60 s);
    the burst rate is 4× the calm one, like the per-minute peak/mean of 4.2 in Azure's code trace."""
    rng = random.Random(seed ^ 0x5EED)
    calm, burst = 1.5 * unit, 6 * unit
    segments, t, bursting = [], 0.0, False
    while t < 3600:
        segments.append(Segment(round(t, 1), burst if bursting else calm))
        t += rng.expovariate(1 / (60.0 if bursting else 240.0))
        bursting = not bursting
    return LlmTrace(
        "bursty",
        f"MMPP: {calm:.0f} req/s calm (mean 4 min), {burst:.0f} in bursts (mean 1 min)",
        tuple(segments),
        3600.0,
    )


def builtin_traces(unit: float, seed: int) -> list[LlmTrace]:
    return [step_trace(unit), spike_trace(unit), diurnal_trace(unit), bursty_trace(unit, seed)]


# ---------------------------------------------------------------------------------------------------------
# A trace from a file.


class TraceFileError(ValueError):
    """A trace file that cannot be read: the message names the file, the row and what is allowed."""


def _number(path: Path, row: int, column: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TraceFileError(f"{path}: row {row}: {column} {text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise TraceFileError(f"{path}: row {row}: {column} {text!r} must be a finite number ≥ 0")
    return value


def read_trace(path: Path) -> LlmTrace:
    """Each row's rate holds until the next row's seconds; the last row holds as long as the one before it
    (a single row: one hour)."""
    try:
        text = path.read_text()
    except OSError as error:
        raise TraceFileError(f"{path}: cannot read: {error.strerror}") from None
    rows = list(csv.reader(text.splitlines()))
    if not rows or not any(cell.strip() for cell in rows[0]):
        raise TraceFileError(f"{path}: row 1: the file is empty; the header must be {','.join(HEADER)}")
    header = tuple(cell.strip() for cell in rows[0])
    if header not in (HEADER, HEADER_WITH_TOKENS):
        raise TraceFileError(
            f"{path}: row 1: header {','.join(header)!r} is not allowed; use {','.join(HEADER)}"
            f" or {','.join(HEADER_WITH_TOKENS)}"
        )
    segments: list[Segment] = []
    for number, cells in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in cells):
            continue
        if len(cells) != len(header):
            raise TraceFileError(f"{path}: row {number}: {len(cells)} columns; the header has {len(header)}")
        seconds, rate, *tokens = (
            _number(path, number, h, c.strip()) for h, c in zip(header, cells, strict=True)
        )
        if segments and seconds <= segments[-1].start:
            raise TraceFileError(
                f"{path}: row {number}: seconds {seconds:g} must be greater than the row before ({segments[-1].start:g})"
            )
        if any(t <= 0 for t in tokens):
            raise TraceFileError(f"{path}: row {number}: prompt_tokens and output_tokens must be > 0")
        segments.append(Segment(seconds, rate, *tokens))
    if not segments:
        raise TraceFileError(f"{path}: row 2: no rows after the header; at least one is needed")
    last = segments[-1].start - segments[-2].start if len(segments) > 1 else 3600.0
    if segments[0].start > 0:
        segments.insert(0, Segment(0.0, 0.0))
    return LlmTrace(path.stem, f"from {path.name}", tuple(segments), segments[-1].start + last)
