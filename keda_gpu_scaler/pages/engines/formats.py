"""The inference servers' page formats as data (one EngineFormat each) and the one reader of them all.

Each format says which gauges give a pod's waiting and running requests and KV-cache use, which labels
tell its engines apart, and which counters `metric: demand` reads; read() and read_counters() read any
page with any format. Where a server truly differs in logic (Triton's TensorRT-LLM backend), the format
carries that function as a field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import chain

from keda_gpu_scaler.pages.engines._common import (
    TPOT,
    TTFT,
    CounterFamily,
    DemandCounters,
    Engine,
    Families,
    Gauge,
    InferenceMetric,
    InferenceReading,
    LatencyFamilies,
    Missing,
    MissingKind,
    Series,
    Value,
    by_name,
    counter_series,
    engine_count,
    fraction_percent,
    gauge,
    gauge_of_spellings,
    histogram_sizes,
    latency_names,
    latency_series,
    model_of,
    models_on,
    not_exported,
    selector_text,
)


@dataclass(frozen=True, slots=True, eq=False)
class Level:
    """A gauge a server prints: its spellings, preferred first (the first on a page is read, so a page
    printing two counts once), and, where one family holds several gauges, the label values of this one."""

    spellings: tuple[str, ...] = ()  # none: the server prints no such gauge
    where: Mapping[str, str] = field(default_factory=dict)
    # Where no spelling is on the page, what printed the later ones (said in the reason).
    older: str = ""

    @property
    def name(self) -> str:
        return self.spellings[0] if self.spellings else ""


NOT_PRINTED = Level()

# Reads the KV-cache value of a page that lacks the KV gauge (its Missing(FAMILY_ABSENT) given).
KvAbsent = Callable[[Families, str | None, Missing], Value]


@dataclass(frozen=True, slots=True, eq=False)
class EngineFormat:
    """One page format of one engine; an engine serving two formats (TensorRT-LLM) has two."""

    engine: Engine
    waiting: Level  # its first spelling names the engine in messages (every release prints it)
    running: Level = NOT_PRINTED
    kv_cache: Level = NOT_PRINTED  # a fraction 0–1, read as a percentage
    # Labels telling a pod's engines apart (see gauge); series differing in anything else are copies.
    engine_labels: tuple[str, ...] = ()
    # Labels that split an engine's requests into disjoint sets on its counters and histograms (summed),
    # which its gauges print empty (their total): SGLang's per-request `priority`.
    request_labels: tuple[str, ...] = ()
    metrics: frozenset[InferenceMetric] = frozenset(InferenceMetric)
    # Whether its series carry a model label (`model_name`/`model`), i.e. whether `model` can select any.
    has_model_label: bool = True
    # `metric: demand`: the families of finished requests (none: not served) and the token counters
    # (None: not exported); `not_exported` names what is missing of them.
    finished: tuple[CounterFamily, ...] = ()
    prompt_tokens: CounterFamily | None = None
    generation_tokens: CounterFamily | None = None
    not_exported: str = "token counters"
    # Per-request token histograms (prompt, generation) whose _sum/_count give a request's true size.
    request_sizes: tuple[str, str] | None = None
    latency: LatencyFamilies = field(default_factory=dict)
    # On a page without any of its families: why, for every value (vLLM prints them only once started).
    not_started: str = ""
    kv_absent: KvAbsent | None = None
    # Counters count only for models that carry this family (the others count the same requests again).
    counted_models_of: str = ""
    sample_names: frozenset[str] = field(init=False)  # the gauges it reads
    counter_names: frozenset[str] = field(init=False)  # the counters `metric: demand` reads

    def __post_init__(self) -> None:
        levels = (self.waiting, self.running, self.kv_cache)
        object.__setattr__(self, "sample_names", frozenset(n for level in levels for n in level.spellings))
        counters = (*self.finished, self.prompt_tokens, self.generation_tokens)
        sizes = self.request_sizes or ()
        object.__setattr__(
            self,
            "counter_names",
            frozenset(n for family in counters if family for n in family.spellings)
            | {f"{name}_{part}" for name in sizes for part in ("sum", "count")}
            | latency_names(self.latency),
        )

    @property
    def signature(self) -> str:
        return self.waiting.name

    @property
    def tokens(self) -> bool:
        """Whether it prints token counters (demandUnit tokens weighs requests by them)."""
        return self.prompt_tokens is not None


def read(fmt: EngineFormat, page: Families, model: str | None) -> InferenceReading:
    """One pod's reading of a page (grouped by name, holding only `fmt`'s sample names)."""
    if not page and fmt.not_started:
        return _not_started(fmt)
    waiting = _gauge(page, fmt.waiting, fmt, model)
    gauges = [waiting]
    running: Value
    if fmt.running.spellings:
        gauges.append(running_gauge := _gauge(page, fmt.running, fmt, model))
        running = running_gauge.total()
    else:
        running = not_exported(fmt.engine, f"running-request count (only {fmt.signature})")
    kv_cache: Value
    if fmt.kv_cache.spellings:
        gauges.append(kv := _gauge(page, fmt.kv_cache, fmt, model))
        kv_cache = _kv_percent(fmt, page, model, kv)
    else:
        kv_cache = not_exported(fmt.engine, "KV-cache usage")
    return InferenceReading(
        fmt.engine,
        waiting=waiting.total(),
        running=running,
        kv_cache=kv_cache,
        engines=engine_count(*gauges),
        models=models_on(page, fmt.sample_names) if fmt.has_model_label else (),
    )


def _gauge(page: Families, level: Level, fmt: EngineFormat, model: str | None) -> Gauge:
    return gauge_of_spellings(
        page,
        level.spellings,
        model=model,
        engine_labels=fmt.engine_labels,
        where=level.where,
        older=level.older,
    )


def _kv_percent(fmt: EngineFormat, page: Families, model: str | None, kv: Gauge) -> Value:
    value = kv.mean()
    if isinstance(value, Missing) and value.kind is MissingKind.FAMILY_ABSENT and fmt.kv_absent is not None:
        value = fmt.kv_absent(page, model, value)
    return fraction_percent(value)


def _not_started(fmt: EngineFormat) -> InferenceReading:
    def absent(family: str) -> Missing:
        return Missing(MissingKind.FAMILY_ABSENT, f"{family} is not on the page ({fmt.not_started})", family)

    return InferenceReading(
        fmt.engine, absent(fmt.waiting.name), absent(fmt.running.name), absent(fmt.kv_cache.name)
    )


def read_counters(fmt: EngineFormat, page: Families, model: str | None) -> DemandCounters:
    """One pod's demand counters from a page holding `fmt`'s counters and gauges."""
    if fmt.counted_models_of:
        counted = {model_of(s.labels) for s in page.get(fmt.counted_models_of, ())}
        page = by_name(
            s
            for s in chain.from_iterable(page.values())
            if s.name not in fmt.counter_names or model_of(s.labels) in counted
        )
    missing = not_exported(fmt.engine, fmt.not_exported)
    if not fmt.finished:
        return DemandCounters(missing, missing, missing)

    def tokens(family: CounterFamily | None) -> Series | Missing:
        return missing if family is None else counter_series(page, (family,), model=model)

    return DemandCounters(
        finished=counter_series(page, fmt.finished, model=model),
        prompt_tokens=tokens(fmt.prompt_tokens),
        generation_tokens=tokens(fmt.generation_tokens),
        sizes={}
        if fmt.request_sizes is None
        else histogram_sizes(page, *fmt.request_sizes, fmt.engine_labels + fmt.request_labels, model),
        latency=latency_series(
            page, fmt.latency, fmt.engine_labels + fmt.request_labels, model, PER_TOKEN_HISTOGRAMS
        ),
    )


# --- the formats ------------------------------------------------------------------------------------

# The time-per-output-token histograms that observe every gap between tokens, not a request's mean: read
# as their own kind (ITL), never summed with a per-request one (two builds of one engine in a rolling
# update print one each).
PER_TOKEN_HISTOGRAMS = frozenset(
    {
        "vllm:inter_token_latency_seconds",
        "vllm:time_per_output_token_seconds",
        "sglang:inter_token_latency_seconds",
        "sglang_inter_token_latency_seconds",
    }
)

# vllm/v1/metrics/loggers.py: gauges labelled model_name and engine (one series per data-parallel engine).
# Never read: newer releases break vllm:num_requests_waiting down by reason; adding it would count the
# same waiting requests twice. Named here so that the tests and the demo can say so.
VLLM_WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
VLLM = EngineFormat(
    Engine.VLLM,
    Level(("vllm:num_requests_waiting",)),
    Level(("vllm:num_requests_running",)),
    # A fraction despite the name; gpu_cache_usage_perc is its name before 0.9 (hidden by default after).
    Level(("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), older="releases before 0.9"),
    engine_labels=("engine",),
    # v0.8 and later: requests finished, per `finished_reason` (stop, length, abort, error) and engine,
    # each created at start-up; tokens per engine (prompts as each prefill runs, generated ones per step).
    finished=(CounterFamily(("vllm:request_success_total",), ("engine", "finished_reason")),),
    prompt_tokens=CounterFamily(("vllm:prompt_tokens_total",), ("engine",)),
    generation_tokens=CounterFamily(("vllm:generation_tokens_total",), ("engine",)),
    # Observed as each request finishes: a finished request's true size, where the token counters
    # count prompts at admission, before those requests finish.
    request_sizes=("vllm:request_prompt_tokens", "vllm:request_generation_tokens"),
    # Time per output token: read first as each request's mean (request_time_per_output_token, one
    # observation per finished request, from 0.10 on), since the SLO counts requests; else the time
    # between output tokens (one observation per token, named inter_token_latency from 0.10 on): its
    # quantile is a stricter reading, one slow step shows in it before it moves a request's mean.
    latency={
        TTFT: ("vllm:time_to_first_token_seconds",),
        TPOT: (
            "vllm:request_time_per_output_token_seconds",
            "vllm:inter_token_latency_seconds",
            "vllm:time_per_output_token_seconds",
        ),
    },
    not_started="vLLM prints it once its engine has started",
)

# python/sglang/srt/metrics/collector.py, labelled model_name; recent releases add tp_rank, pp_rank and
# dp_rank (and moe_ep_rank, engine_type). Each family also in the spelling of sgl-router's /engine_metrics
# and of a Prometheus 3 that escapes names with underscores: read where the `sglang:` one is absent.
_SGLANG_LAZY = "SGLang prints it, with --enable-metrics, once a request has finished"
# Its separate engines (data-parallel ranks), and the requests its tokenizer counts apart (priorities).
_SGLANG_ENGINES, _SGLANG_REQUESTS = ("dp_rank",), ("priority",)
_SGLANG_SPLIT = _SGLANG_ENGINES + _SGLANG_REQUESTS  # its counters' separate series


def _sglang(name: str) -> tuple[str, str]:
    return f"sglang:{name}", f"sglang_{name}"


SGLANG = EngineFormat(
    Engine.SGLANG,
    Level(_sglang("num_queue_reqs")),
    Level(_sglang("num_running_reqs")),
    Level(_sglang("token_usage")),  # fraction of the KV pool's tokens in use
    # dp_rank: data-parallel ranks are separate schedulers, each with its own queue. tp_rank, pp_rank
    # (and moe_ep_rank) are ranks of one scheduler repeating its value: copies, counted once.
    engine_labels=_SGLANG_ENGINES,
    # With --enable-priority-scheduling the tokenizer's counters and histograms count each priority apart.
    request_labels=_SGLANG_REQUESTS,
    # TokenizerMetricsCollector (v0.4 on): every finished request, whatever its finish reason, and its
    # tokens. num_aborted_requests_total is not added: an aborted request that ran is in the total too.
    # A labelled counter is printed only once it moved.
    finished=(CounterFamily(_sglang("num_requests_total"), _SGLANG_SPLIT, absent_hint=_SGLANG_LAZY),),
    prompt_tokens=CounterFamily(_sglang("prompt_tokens_total"), _SGLANG_SPLIT, absent_hint=_SGLANG_LAZY),
    generation_tokens=CounterFamily(
        _sglang("generation_tokens_total"), _SGLANG_SPLIT, absent_hint=_SGLANG_LAZY
    ),
    # The time between output tokens: inter_token_latency, or a request's mean where a release lacks it.
    # (Not the request's mean first, as vLLM's: some releases observe e2e latency ÷ tokens there, with
    # the time to first token in it.)
    latency={
        TTFT: _sglang("time_to_first_token_seconds"),
        TPOT: (*_sglang("inter_token_latency_seconds"), *_sglang("time_per_output_token_seconds")),
    },
)

# docs/source/reference/metrics.md: unlabelled gauges, one router per pod; no KV-cache percentage (TGI
# exports token counts of the batch, not of the cache). tgi_request_success counts requests that
# finished generating, tgi_request_failure{err} the others; tgi_request_count counts arrivals and is not
# read. The Rust exporter prints a counter only once it moved. Tokens: the sums of the per-request
# prompt-length and generated-token histograms.
TGI = EngineFormat(
    Engine.TGI,
    Level(("tgi_queue_size",)),
    Level(("tgi_batch_current_size",)),
    metrics=frozenset({InferenceMetric.REQUESTS, InferenceMetric.QUEUE, InferenceMetric.DEMAND}),
    has_model_label=False,
    finished=(
        CounterFamily(("tgi_request_success",), absent_hint="TGI prints it once a request has succeeded"),
        CounterFamily(("tgi_request_failure",), ("err",), optional=True),
    ),
    prompt_tokens=CounterFamily(("tgi_request_input_length_sum",)),
    generation_tokens=CounterFamily(("tgi_request_generated_tokens_sum",)),
    request_sizes=("tgi_request_input_length", "tgi_request_generated_tokens"),
    # No time-to-first-token histogram (prefill and queue durations are parts of it, not it).
    latency={TPOT: ("tgi_request_mean_time_per_token_duration",)},
)

# docs/user_guide/metrics.md ("Count" metrics): requests finished with success and with failure per
# model and version, printed from the moment a model is loaded; failures labelled by `reason` from 24.x
# (older releases print none). Two loaded versions of one model are two sets of instances.
_TRITON_FINISHED = (
    CounterFamily(("nv_inference_request_success",), ("version",)),
    CounterFamily(("nv_inference_request_failure",), ("version", "reason"), optional=True),
)

# tensorrtllm_backend's metrics on Triton's port (labels model, version): requests by request_type,
# KV blocks by kv_cache_block_type (fraction, used, free, max, tokens_per).
_TRTLLM_REQUESTS = "nv_trt_llm_request_metrics"
_TRTLLM_KV_BLOCKS = "nv_trt_llm_kv_cache_block_metrics"


def _trtllm_used_over_max(page: Families, model: str | None, absent: Missing) -> Value:
    """Backends older than the "fraction" series print block counts only: used / max is that fraction."""
    used, most = (
        gauge(
            page,
            _TRTLLM_KV_BLOCKS,
            model=model,
            engine_labels=("version",),
            where={"kv_cache_block_type": kind},
        )
        for kind in ("used", "max")
    )
    if used.missing is not None and used.missing.kind is MissingKind.FAMILY_ABSENT:
        return absent
    for part in (used, most):
        if part.missing is not None:
            return part.missing
    if not all(most.values.get(key) for key in used.values):
        family = selector_text(_TRTLLM_KV_BLOCKS, {"kv_cache_block_type": "max"})
        return Missing(
            MissingKind.NO_VALUE, f"{family} is 0 or missing for an engine that reports used blocks", family
        )
    return sum(blocks / most.values[key] for key, blocks in used.values.items()) / len(used.values)


# Listed before Triton: a Triton page that carries the backend's families is the backend's.
TRTLLM = EngineFormat(
    Engine.TRTLLM,
    Level((_TRTLLM_REQUESTS,), where={"request_type": "waiting"}),
    # "scheduled" is what the batcher runs this iteration, which the inference extension's model-server
    # protocol maps running requests to too ("active" also counts requests paused or in transfer).
    Level((_TRTLLM_REQUESTS,), where={"request_type": "scheduled"}),
    Level((_TRTLLM_KV_BLOCKS,), where={"kv_cache_block_type": "fraction"}),
    engine_labels=("version",),
    # The backend prints no counters: Triton's count its model's requests. Only models that carry the
    # backend's request metrics count (an ensemble's other models count the same requests again).
    finished=_TRITON_FINISHED,
    not_exported="token counters (the Triton backend)",
    kv_absent=_trtllm_used_over_max,
    counted_models_of=_TRTLLM_REQUESTS,
)

# TensorRT-LLM's own OpenAI server (1.3.0rc12 on, with return_perf_metrics and enable_iter_perf_stats),
# on /prometheus/metrics; labelled model_name (and engine_type: copies). tensorrt_llm/metrics/collector.py
# counts every finished request by `finished_reason`, and its tokens, once a request has finished.
_TRTLLM_SERVE_LAZY = "trtllm-serve prints it with return_perf_metrics, once a request has finished"
TRTLLM_SERVE = EngineFormat(
    Engine.TRTLLM,
    Level(("trtllm_num_requests_waiting",)),
    Level(("trtllm_num_requests_running",)),
    Level(("trtllm_kv_cache_utilization",)),
    finished=(
        CounterFamily(
            ("trtllm_request_success_total",), ("finished_reason",), absent_hint=_TRTLLM_SERVE_LAZY
        ),
    ),
    prompt_tokens=CounterFamily(("trtllm_prompt_tokens_total",), absent_hint=_TRTLLM_SERVE_LAZY),
    generation_tokens=CounterFamily(("trtllm_generation_tokens_total",), absent_hint=_TRTLLM_SERVE_LAZY),
)

# Pending requests per loaded model version; no running count (its counters are rates, not levels), so
# for `demand` the change in flight is that of pending requests alone (those executing are at most the
# instances' batch slots: a bounded error). An ensemble counts each request once per step model: give
# `model` to read the one that holds the queue. No token counters.
TRITON = EngineFormat(
    Engine.TRITON,
    Level(("nv_inference_pending_request_count",)),
    engine_labels=("version",),
    metrics=frozenset({InferenceMetric.QUEUE, InferenceMetric.DEMAND}),
    finished=_TRITON_FINISHED,
)


def _llamacpp_kv_absent(page: Families, model: str | None, absent: Missing) -> Value:
    """Only older builds print the KV gauge: its absence is a gauge not exported, not one not printed yet."""
    return Missing(
        MissingKind.NOT_EXPORTED,
        f"{Engine.LLAMACPP.value} exports no KV-cache usage: {absent.family} is not on the page (only older "
        "llama.cpp builds print it)",
        absent.family,
    )


# tools/server/server.cpp (`llama-server --metrics`): unlabelled gauges, one model per server. A request
# is "processing" while it holds a slot, "deferred" while it waits for one. The KV gauge is read where a
# page has it, but `engine: llamacpp` cannot promise kv_cache. No `demand`: no counter of finished
# requests (its counters are tokens and decode calls).
LLAMACPP = EngineFormat(
    Engine.LLAMACPP,
    Level(("llamacpp:requests_deferred",)),
    Level(("llamacpp:requests_processing",)),
    Level(("llamacpp:kv_cache_usage_ratio",)),
    metrics=frozenset({InferenceMetric.REQUESTS, InferenceMetric.QUEUE}),
    has_model_label=False,
    not_exported="counter of finished requests (its /metrics counts tokens and decode calls, not requests)",
    kv_absent=_llamacpp_kv_absent,
)

# Adding an engine: an EngineFormat above and a line here (docs/ADDING_A_VENDOR.md). The order is the
# order `auto` tries them in; where one engine has two formats, a trigger naming it reads a page with the
# first whose families are on it.
ENGINES: tuple[EngineFormat, ...] = (VLLM, SGLANG, TGI, TRTLLM, TRTLLM_SERVE, TRITON, LLAMACPP)
