"""Request traces for the LLM fleet: a rate (and token means) piecewise constant in time, and the arrivals
drawn from it: Poisson at the segment's rate (or gamma gaps with a higher variation), prompt and output
tokens log-normal with the segment's means.

Built-in, the developers' (DEVELOPERS: constants were chosen on them): step, spike, a day compressed 4×,
bursty (a two-state Markov-modulated process with gamma gaps, shaped like Azure's code trace), mix-shift
(chat hours and RAG/agent hours), and diurnal with quiet nights (the wake-from-zero runs). Held out
(HELD_OUT: judged only): flash-crowd (crowds longer than a cold start) and mix-churn (the mix changes
every 10–20 minutes). Any other from a CSV file with header
`seconds,requests_per_second[,prompt_tokens,output_tokens]`.
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
# Long-prompt traffic (assumptions, in the range RAG and agent services report): retrieved context or tool
# transcripts of thousands of tokens, and longer answers.
RAG = (6000.0, 600.0)
AGENT = (4000.0, 1000.0)
QUIET_SECONDS = 300.0  # a stretch with no arrivals at least this long is a quiet period (KEDA's cooldown)

HEADER = ("seconds", "requests_per_second")
HEADER_WITH_TOKENS = (*HEADER, "prompt_tokens", "output_tokens")


@dataclass(frozen=True)
class Segment:
    start: float
    rate: float  # requests per second
    prompt_mean: float = PROMPT_MEAN
    output_mean: float = OUTPUT_MEAN
    cv: float = 1.0  # coefficient of variation of the gaps between arrivals: 1 is Poisson, more is burstier


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

    def segment_at(self, t: float) -> Segment | None:
        """The segment in force at t (None before the first, or at or after the end)."""
        if t >= self.duration:
            return None
        found = None
        for segment in self.segments:
            if segment.start > t:
                break
            found = segment
        return found

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
        # Poisson arrivals are memoryless: restarting the exponential gaps at each segment is exact (for
        # gamma gaps, a fresh start at each segment: close enough at these rates).
        shape = 1 / (segment.cv * segment.cv)

        def gap(rate: float = segment.rate, shape: float = shape) -> float:
            return rng.expovariate(rate) if shape == 1 else rng.gammavariate(shape, 1 / (shape * rate))

        t = segment.start + gap()
        while t < end:
            times.append(t)
            prompts.append(_lognormal(rng, segment.prompt_mean, PROMPT_SIGMA))
            outputs.append(_lognormal(rng, segment.output_mean, OUTPUT_SIGMA))
            t += gap()
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
    """Shaped like Azure's 2023 code trace (per-minute peak/mean 4.2, per-second counts far burstier than
    Poisson) with its conversation mix: calm and burst states with exponential dwell times (mean 300 s and
    45 s), bursts 7× the calm rate, gamma gaps with a coefficient of variation of 2 in both."""
    rng = random.Random(seed ^ 0x5EED)
    calm, burst = 1.2 * unit, 8.4 * unit
    segments, t, bursting = [], 0.0, False
    while t < 7200:
        segments.append(Segment(round(t, 1), burst if bursting else calm, cv=2.0))
        t += rng.expovariate(1 / (45.0 if bursting else 300.0))
        bursting = not bursting
    return LlmTrace(
        "bursty",
        f"2 h, Azure-code-like: {calm:.0f} req/s calm (mean 5 min), {burst:.0f} in bursts (mean 45 s), gaps CV 2",
        tuple(segments),
        7200.0,
    )


def day_trace(unit: float, seed: int) -> LlmTrace:
    """A day compressed 4× into 6 hours: conversation traffic from a trough at 04:00 to a peak 2.5× higher
    at 14:00 (Azure 2024: weekday peak/trough ≈2–2.5× for conversation), each compressed 5 minutes ±10 %."""
    rng = random.Random(seed ^ 0xDA7)
    peak, trough = 7 * unit, 2.8 * unit
    segments = []
    for index in range(72):  # 72 × 5 compressed minutes = 24 hours
        hour = index / 3
        shape = (1 + math.cos(2 * math.pi * (hour - 14) / 24)) / 2
        rate = (trough + (peak - trough) * shape) * rng.uniform(0.9, 1.1)
        segments.append(Segment(index * 300.0, round(rate, 2)))
    return LlmTrace(
        "day",
        f"a day in 6 h (4× compressed): {trough:.0f} req/s at 04:00 to {peak:.0f} at 14:00, ±10 % per 5 min",
        tuple(segments),
        21600.0,
    )


def mix_shift_trace(unit: float) -> LlmTrace:
    """The mix changes by the hour (each block 30 minutes here): chat, then RAG, chat, agents, chat, RAG.
    A replica serves about 11 chat requests per second at the latency target, 2.3 RAG and 2.8 agent ones."""
    chat = (PROMPT_MEAN, OUTPUT_MEAN)
    blocks = [(5.5, chat), (1.6, RAG), (4.0, chat), (1.3, AGENT), (5.0, chat), (1.1, RAG)]
    segments = tuple(Segment(i * 1800.0, round(pods * unit, 2), *mix) for i, (pods, mix) in enumerate(blocks))
    return LlmTrace(
        "mix-shift",
        "3 h in 30-min blocks: chat 62 req/s, RAG 18, chat 45, agents 15, chat 56, RAG 12",
        segments,
        10800.0,
    )


def flash_crowd_trace(unit: float) -> LlmTrace:
    """Two flash crowds longer than a cold start (65–85 s): 3 → 9 pods' worth for 4 minutes, and later
    3 → 7 for 3 minutes, each rising within a minute (a launch, a viral link)."""
    base = 3 * unit
    segments = (
        Segment(0, base),
        Segment(1800, 6 * unit),
        Segment(1860, 9 * unit),
        Segment(2100, base),
        Segment(5400, 7 * unit),
        Segment(5580, base),
    )
    return LlmTrace(
        "flash-crowd",
        f"3 h at {base:.0f} req/s; 4 min at {9 * unit:.0f} from 30 min, 3 min at {7 * unit:.0f} from 90 min",
        segments,
        10800.0,
    )


# Requests per second one replica serves at the latency target, per mix (llm_calibrate.capacity; it
# cannot be imported here: it draws its ramp from this module).
MIX_CAPACITY = {"chat": 11.2, "rag": 2.31, "agent": 2.78, "code": 6.8, "short": 24.8}
MIX_TOKENS = {
    "chat": (PROMPT_MEAN, OUTPUT_MEAN),
    "rag": RAG,
    "agent": AGENT,
    "code": (2048.0, 28.0),
    "short": (300.0, 300.0),
}


def mix_churn_trace(seed: int, hours: float = 4.0) -> LlmTrace:
    """The request mix changes every 10–20 minutes (seeded): each block a mix drawn from MIX_TOKENS at 2–6
    replicas' worth of it, so the rate in requests and the work per request move together or apart."""
    rng = random.Random(seed ^ 0x31C5)
    segments, t, duration = [], 0.0, hours * 3600
    while t < duration:
        mix = rng.choice(sorted(MIX_TOKENS))
        rate = rng.uniform(2.0, 6.0) * MIX_CAPACITY[mix] * 0.7
        segments.append(Segment(t, round(rate, 2), *MIX_TOKENS[mix]))
        t += round(rng.uniform(600.0, 1200.0))
    return LlmTrace(
        "mix-churn",
        f"{hours:g} h: chat, RAG, agent, code or short-chat blocks of 10–20 min at 2–6 replicas' worth × 0.7",
        tuple(segments),
        duration,
    )


# The developers' traces (the product's constants were chosen on them) and the held-out ones (judged only).
DEVELOPERS = ("step", "spike", "day", "bursty", "mix-shift")
HELD_OUT = ("flash-crowd", "mix-churn")


def held_out_traces(unit: float, seed: int) -> list[LlmTrace]:
    return [flash_crowd_trace(unit), mix_churn_trace(seed)]


def builtin_traces(unit: float, seed: int) -> list[LlmTrace]:
    return [
        step_trace(unit),
        spike_trace(unit),
        day_trace(unit, seed),
        bursty_trace(unit, seed),
        mix_shift_trace(unit),
    ]


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
