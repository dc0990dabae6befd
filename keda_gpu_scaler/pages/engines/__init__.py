"""Inference-engine layer: a pod's inference-server page turned into its load (pure: no I/O, no clock).

The counterpart of vendors/ for SPEC §6: each page format is a row of data in formats.py (family names,
the rules of its labels), read by its one reader; an engine serving two formats (TensorRT-LLM under
Triton and as trtllm-serve) has two rows. Everything here works on parsed samples; fetching pages, choosing
pods and turning a missing value into a status are the caller's job.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence, Set
from dataclasses import replace

from keda_gpu_scaler.pages import exposition
from keda_gpu_scaler.pages.engines._common import (
    AUTO,
    ITL,
    LATENCY_KINDS,
    MODEL_LABELS,
    POD_LABELS,
    TPOT,
    DemandCounters,
    Engine,
    Families,
    InferenceMetric,
    InferenceReading,
    Missing,
    MissingKind,
    PodKey,
    PodSamples,
    Value,
    by_name,
    folded_model,
    latency_names,
    pod_of,
)
from keda_gpu_scaler.pages.engines.formats import (
    ENGINES,
    PER_TOKEN_HISTOGRAMS,
    EngineFormat,
    read,
    read_counters,
)
from keda_gpu_scaler.pages.exposition import Sample

__all__ = [
    "AUTO",
    "DEMAND_SAMPLE_NAMES",
    "ENGINES",
    "ENGINE_CHOICES",
    "ENGINE_SAMPLE_NAMES",
    "LATENCY_FAMILIES",
    "MODEL_LABELS",
    "POD_LABELS",
    "DemandCounters",
    "Engine",
    "EngineFormat",
    "InferenceMetric",
    "InferenceReading",
    "Missing",
    "MissingKind",
    "PodKey",
    "PodSamples",
    "Value",
    "accepts_model",
    "counters_format",
    "counters_of",
    "engine_supports",
    "folded_model",
    "format_counters",
    "in_flight",
    "page_counters",
    "pod_counters",
    "pod_of",
    "pod_reading",
    "recognise",
    "supported_metrics",
    "supports_tokens",
    "unsupported_message",
    "value_for",
    "wrong_types",
]


_BY_ENGINE: dict[Engine, tuple[EngineFormat, ...]] = {
    engine: tuple(fmt for fmt in ENGINES if fmt.engine is engine) for engine in Engine
}

ENGINE_SAMPLE_NAMES: frozenset[str] = frozenset(name for fmt in ENGINES for name in fmt.sample_names)
"""Every sample name an engine reads: the filter to parse inference pages (and Prometheus queries) with."""

DEMAND_SAMPLE_NAMES: frozenset[str] = frozenset(name for fmt in ENGINES for name in fmt.counter_names)
"""The counters `metric: demand` reads besides the gauges: pod pages are parsed with these too."""


def _printed_as(kind: str) -> tuple[str, ...]:
    """The histograms engines print one latency kind in (an ITL is a per-token TPOT histogram)."""
    listed = TPOT if kind == ITL else kind
    names = (name for fmt in ENGINES for name in fmt.latency.get(listed, ()))
    return tuple(name for name in names if (name in PER_TOKEN_HISTOGRAMS) == (kind == ITL))


LATENCY_FAMILIES: dict[str, tuple[str, ...]] = {kind: _printed_as(kind) for kind in LATENCY_KINDS}
"""Per latency kind, the histograms engines print it in (their base names): for messages."""

_DEMAND_WITHOUT_LATENCY = DEMAND_SAMPLE_NAMES - latency_names(LATENCY_FAMILIES)

ENGINE_CHOICES: tuple[str, ...] = (AUTO, *(engine.value for engine in Engine))
"""The values the trigger key `engine` allows, `auto` first."""


def _engine(engine: Engine | str) -> Engine | None:
    """The engine a choice names; None for `auto`. ValueError for anything else."""
    if engine == AUTO:
        return None
    return Engine(engine)


def _format_on(names: Set[str], formats: Iterable[EngineFormat]) -> EngineFormat | None:
    """The first of `formats` whose families are among the page's sample names."""
    return next((fmt for fmt in formats if not names.isdisjoint(fmt.sample_names)), None)


def recognise(samples: Iterable[Sample]) -> Engine | None:
    """The engine whose families are on a page (registry order decides), or None when there are none."""
    fmt = _format_on({sample.name for sample in samples}, ENGINES)
    return None if fmt is None else fmt.engine


def supported_metrics(engine: Engine | str) -> tuple[InferenceMetric, ...]:
    """The metrics an engine can serve, in InferenceMetric order (every metric for `auto`)."""
    named = _engine(engine)
    if named is None:
        allowed = frozenset(InferenceMetric)
    else:
        allowed = frozenset(metric for fmt in _BY_ENGINE[named] for metric in fmt.metrics)
    return tuple(metric for metric in InferenceMetric if metric in allowed)


def engine_supports(engine: Engine | str, metric: InferenceMetric | str) -> bool:
    """False when a trigger names an engine that does not export what `metric` needs (INVALID_ARGUMENT).

    `auto` supports every metric: what the page turns out to be is only known when it is read, and a
    metric the recognised engine lacks is then a Missing(NOT_EXPORTED) reading (UNAVAILABLE).
    """
    return InferenceMetric(metric) in supported_metrics(engine)


def accepts_model(engine: Engine | str) -> bool:
    """False when a named engine's series carry no model label (TGI), so that `model` can match nothing.

    Trigger validation can reject such a `model` up front; `auto` accepts it (a reading whose family has
    no series of the model is then Missing(NO_MODEL)).
    """
    named = _engine(engine)
    return named is None or any(fmt.has_model_label for fmt in _BY_ENGINE[named])


def supports_tokens(engine: Engine | str) -> bool:
    """False when a trigger names an engine without token counters (demandUnit tokens cannot work)."""
    named = _engine(engine)
    return named is None or any(fmt.tokens for fmt in _BY_ENGINE[named])


def measured_latencies(engine: Engine | str) -> frozenset[str] | None:
    """The latency kinds (TTFT, TPOT) a named engine prints histograms of; None under `auto` (what the
    page turns out to be is only known when it is read)."""
    named = _engine(engine)
    return None if named is None else frozenset(kind for fmt in _BY_ENGINE[named] for kind in fmt.latency)


def unsupported_message(engine: Engine | str, metric: InferenceMetric | str) -> str:
    """The INVALID_ARGUMENT text for a metric the named engine does not export."""
    allowed = ", ".join(supported_metrics(engine))
    return f"engine {engine!s} does not export what metric {metric!s} needs; with {engine!s} use: {allowed}"


def _no_engine() -> InferenceReading:
    missing = Missing(
        MissingKind.NO_ENGINE,
        "no inference server's families on the page (none of "
        f"{', '.join(fmt.signature for fmt in ENGINES)}, ...); vLLM prints its own only once its "
        "engine has started",
    )
    return InferenceReading(None, missing, missing, missing)


def pod_reading(
    samples: Iterable[Sample], engine: Engine | str = AUTO, model: str | None = None
) -> InferenceReading:
    """One pod's reading from its own page's samples (unfiltered or parsed with ENGINE_SAMPLE_NAMES).

    `engine` is a trigger's choice: `auto` reads the page as the engine recognise() finds (a reading with
    engine None and Missing(NO_ENGINE) values when there is none); a named engine reads the page as that
    engine, whatever else it carries. `model` keeps only series whose `model_name`/`model` equals it.
    """
    return _reading(by_name(s for s in samples if s.name in ENGINE_SAMPLE_NAMES), engine, model)


def _only(page: Families, names: frozenset[str]) -> Families:
    """The families of `page` among `names`."""
    return {name: series for name, series in page.items() if name in names}


def _reading(page: Families, engine: Engine | str, model: str | None) -> InferenceReading:
    """pod_reading() of a page grouped by name that holds only ENGINE_SAMPLE_NAMES."""
    names = page.keys()
    named = _engine(engine)
    if named is None:
        fmt = _format_on(names, ENGINES)
        if fmt is None:
            return _no_engine()
    else:
        # The engine's format on the page; on a page without any, its first one names what is missing.
        formats = _BY_ENGINE[named]
        found = _format_on(names, formats)
        fmt = found or formats[0]
        if found is None and (other := _format_on(names, ENGINES)) is not None:
            # Another engine's page: say which, so the reader need not guess from the families missing.
            reading = read(fmt, _only(page, fmt.sample_names), model)
            return _noted(
                reading,
                f"the page is recognised as engine {other.engine.value} (it carries {other.signature}):"
                f" set engine: {other.engine.value} or auto",
            )
    return read(fmt, _only(page, fmt.sample_names), model)


def _noted(reading: InferenceReading, note: str) -> InferenceReading:
    """The reading with `note` added to the reason of each value it is missing."""

    def note_on(value: Value) -> Value:
        return replace(value, reason=f"{value.reason}; {note}") if isinstance(value, Missing) else value

    return replace(
        reading,
        waiting=note_on(reading.waiting),
        running=note_on(reading.running),
        kv_cache=note_on(reading.kv_cache),
    )


def value_for(reading: InferenceReading, metric: InferenceMetric | str) -> Value:
    """A pod's value for a trigger metric: requests = running + waiting, queue = waiting, kv_cache = KV %.

    A Missing is never to be read as 0: the caller turns it into a missing pod or an error naming
    `missing.family` / `missing.reason`.
    """
    chosen = InferenceMetric(metric)
    if chosen is InferenceMetric.QUEUE:
        return reading.waiting
    if chosen is InferenceMetric.KV_CACHE:
        return reading.kv_cache
    # requests: the running count is what engines lack most often (Triton), so its reason comes first.
    if isinstance(reading.running, Missing):
        return reading.running
    if isinstance(reading.waiting, Missing):
        return reading.waiting
    return reading.running + reading.waiting


# What the families engines read may be declared as: a gauge, or untyped (Prometheus' /federate output).
_LEVEL_TYPES = frozenset({"gauge", "untyped"})


def wrong_types(page: str | bytes) -> dict[str, str]:
    """The families engines read that a page declares with another type (`# TYPE name counter`): name → type.

    The sample parser skips comment lines, so a server that exports, say, a counter under a gauge's name
    would otherwise be read as a level. A caller can treat a non-empty answer as a page it cannot use,
    naming the family.
    """
    declared = exposition.declared_types(page, ENGINE_SAMPLE_NAMES)
    return {name: kind for name, kind in declared.items() if kind not in _LEVEL_TYPES}


def _format_for(names: Set[str], engine: Engine | str) -> EngineFormat | None:
    """The format a page is read with: under `auto` the first whose families are on it (None: none is);
    for a named engine, its format on the page, or on a page without any its first (to name what is
    missing)."""
    named = _engine(engine)
    if named is None:
        return _format_on(names, ENGINES)
    formats = _BY_ENGINE[named]
    return _format_on(names, formats) or formats[0]


def pod_counters(
    samples: Iterable[Sample], engine: Engine | str = AUTO, model: str | None = None, *, latency: bool = True
) -> tuple[InferenceReading, DemandCounters]:
    """One pod's gauges and its demand counters from its own page (parsed with ENGINE_SAMPLE_NAMES and
    DEMAND_SAMPLE_NAMES), the page read as pod_reading() reads it (the gauges decide the engine).
    `latency=False` leaves the latency histograms unread (`latency` empty): a caller that takes them
    from elsewhere saves their reading, most of a page's counters (nothing else depends on them)."""
    counted = DEMAND_SAMPLE_NAMES if latency else _DEMAND_WITHOUT_LATENCY
    page = by_name(s for s in samples if s.name in ENGINE_SAMPLE_NAMES or s.name in counted)
    gauges = _reading(_only(page, ENGINE_SAMPLE_NAMES), engine, model)
    fmt = _format_for(page.keys() & ENGINE_SAMPLE_NAMES, engine)
    if fmt is None:
        no_engine = gauges.waiting
        assert isinstance(no_engine, Missing)  # no engine on the page: every reading is Missing(NO_ENGINE)
        return gauges, DemandCounters(no_engine, no_engine, no_engine)
    return gauges, _counters(page, fmt, model)


def counters_format(samples: Iterable[Sample], engine: Engine | str) -> int | None:
    """Which format (its index in ENGINES) reads a page's demand counters for an `engine` choice, as
    pod_reading() picks it; None: no engine's families on the page under `auto`."""
    fmt = _format_for({s.name for s in samples if s.name in ENGINE_SAMPLE_NAMES}, engine)
    return None if fmt is None else ENGINES.index(fmt)


def format_counters(samples: Iterable[Sample], index: int, model: str | None) -> DemandCounters:
    """A page's demand counters read with format ENGINES[index] (see counters_format)."""
    return _counters(by_name(samples), ENGINES[index], model)


# A page of more series than this has its demand counters worked out where it is read (in a page worker
# thread for a page over scrape.PARSE_OFF_LOOP_BYTES): about 3 µs a series, 60 ms for a page of 20,000 on
# the event loop every scrape.
COUNTERS_WITH_PAGE_SERIES = 500


def page_counters(samples: Sequence[Sample]) -> tuple[int, DemandCounters] | None:
    """A large page's demand counters in the format `engine: auto` reads it with (None for a small page or
    one without an engine's families): what demand history takes from every page (all models)."""
    if len(samples) <= COUNTERS_WITH_PAGE_SERIES or (index := counters_format(samples, "auto")) is None:
        return None
    return index, format_counters(samples, index, None)


def counters_of(page: PodSamples, index: int) -> DemandCounters:
    """A page's demand counters (all models) in format ENGINES[index]: those worked out with it, if so."""
    if page.counters is not None and page.counters[0] == index:
        return page.counters[1]
    return format_counters(page.samples, index, None)


def _counters(page: Families, fmt: EngineFormat, model: str | None) -> DemandCounters:
    # The gauges too: a counter may count only where a gauge says whose it is (formats.TRTLLM).
    return read_counters(fmt, _only(page, fmt.counter_names | fmt.sample_names), model)


def in_flight(reading: InferenceReading) -> Value:
    """Requests in the server now, for `demand`: running + waiting, or waiting alone where the engine
    exports no running count at all (Triton: see formats.TRITON). A running count missing from a page that
    should have it is Missing, never 0."""
    if isinstance(reading.running, Missing) and reading.running.kind is MissingKind.NOT_EXPORTED:
        return reading.waiting
    return value_for(reading, InferenceMetric.REQUESTS)
