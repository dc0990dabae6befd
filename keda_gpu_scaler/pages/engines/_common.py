"""Types and helpers shared by the inference-engine modules: readings, missing-data reasons, series rules."""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from keda_gpu_scaler.pages import pagetext
from keda_gpu_scaler.pages.exposition import Sample

log = logging.getLogger("keda_gpu_scaler.pages.engines")


class Engine(StrEnum):
    """An inference server whose own page the scaler reads (SPEC §6)."""

    VLLM = "vllm"
    SGLANG = "sglang"
    TGI = "tgi"
    TRITON = "triton"
    TRTLLM = "trtllm"  # TensorRT-LLM: the Triton backend's page, or trtllm-serve's own
    LLAMACPP = "llamacpp"


AUTO = "auto"
"""The `engine` choice meaning: recognise the engine from the families on the pod's page."""


class InferenceMetric(StrEnum):
    """The trigger `metric` values of SPEC §6 and what each is per pod."""

    REQUESTS = "requests"  # running + waiting
    QUEUE = "queue"  # waiting
    KV_CACHE = "kv_cache"  # KV-cache in use, %
    DEMAND = "demand"  # work arriving per second, from the counter of finished requests (demand.py)


class MissingKind(StrEnum):
    """Why a pod's reading has no value, so the caller can pick the status and the words."""

    # Under `auto`: the page carries none of any engine's families. A vLLM server prints its families only
    # once its engine has started, so this is also what a starting vLLM pod looks like.
    NO_ENGINE = "no_engine"
    # The engine never exports what the metric needs (Triton has no running count, TGI no KV-cache %).
    # INVALID_ARGUMENT when the trigger names the engine (see engine_supports), UNAVAILABLE under `auto`.
    NOT_EXPORTED = "not_exported"
    # The engine exports the family but this page lacks it (an engine not started yet, an older release).
    FAMILY_ABSENT = "family_absent"
    # The trigger's `model` matches none of the family's series.
    NO_MODEL = "no_model"
    # The trigger's `model` differs from a model on the page only in case or blanks: it can never match,
    # so the trigger is wrong (INVALID_ARGUMENT for every metric, as for `pending`), not the data.
    MODEL_CASE = "model_case"
    # The family's series are there, but an engine's samples are all NaN, ±Inf or negative.
    NO_VALUE = "no_value"
    # `metric: demand`: no rate. A pod read once (or over no time) has none yet: it counts as the mean of
    # the others (SPEC §6). One read over time without a rate (with demandUnit tokens, none of its
    # requests finished; counters beyond a float's range) is a missing pod.
    NO_RATE = "no_rate"


@dataclass(frozen=True, slots=True)
class Missing:
    """A value a reading does not have: never a 0. `family` names the missing family where there is one."""

    kind: MissingKind
    reason: str
    family: str | None = None


Value = float | Missing
"""A reading's quantity: a number, or why there is none."""


@dataclass(frozen=True, slots=True)
class InferenceReading:
    """One pod's inference-server load, summed over its engines and models (SPEC §6)."""

    engine: Engine | None  # what the page was read as; None: no engine recognised under `auto`
    waiting: Value  # requests waiting (queued), sum over engines and models
    running: Value  # requests being executed, sum over engines and models
    kv_cache: Value  # KV-cache in use, % 0–100, mean over engines
    engines: int = (
        0  # separate engines counted (vLLM `engine`, SGLang `dp_rank`, Triton model versions, × models)
    )
    models: tuple[str, ...] = ()  # models the engine's series name on the page (before any `model` filter)


PodKey = tuple[str, str]
"""(namespace, pod)."""

# Pairs naming a series' pod in a Prometheus answer, first match wins. `exported_*` first: a page that
# carries its own `namespace`/`pod` labels keeps them as `exported_*` when Prometheus attaches the scrape
# target's (honor_labels false), as for the GPU exporters (vendors/_common.POD_LABELS).
POD_LABELS: tuple[tuple[str, str], ...] = (
    ("exported_namespace", "exported_pod"),
    ("namespace", "pod"),
)

# The labels that name a series' model (SPEC §6: `model_name` for vLLM and SGLang, `model` for Triton).
MODEL_LABELS: tuple[str, ...] = ("model_name", "model")


def pod_of(labels: Mapping[str, str]) -> PodKey | None:
    """The pod a series belongs to, from the first pair with both labels set; an empty label is "no pod"."""
    for namespace_key, pod_key in POD_LABELS:
        namespace = labels.get(namespace_key, "")
        pod = labels.get(pod_key, "")
        if namespace and pod:
            return namespace, pod
    return None


def model_of(labels: Mapping[str, str]) -> str:
    for key in MODEL_LABELS:
        value = labels.get(key)
        if value:
            return value
    return ""


def folded_model(model: str) -> str:
    """A model name as it compares ignoring case and blanks (a trigger's near miss of a real name)."""
    return "".join(model.split()).casefold()


def usable(value: float) -> bool:
    """A count or fraction gauge sample that can be read: finite and not negative.

    NaN/±Inf carry no reading (SPEC §4). A negative request count or cache fraction cannot be a
    measurement either; clamping it to 0 would make up a 0, so it is dropped like NaN.
    """
    return math.isfinite(value) and value >= 0


def selector_text(name: str, where: Mapping[str, str] = {}) -> str:
    """How a reason names a family: `name` or `name{label="value"}`."""
    if not where:
        return name
    return name + "{" + pagetext.label_text(sorted(where.items())) + "}"


Families = Mapping[str, Sequence[Sample]]
"""A pod's page: its samples grouped by name, each name's in page order, and no name without samples.
Grouped once per page (by_name), so that each of a page's many gauge and counter reads looks its family
up instead of scanning the whole page."""


def by_name(samples: Iterable[Sample]) -> dict[str, list[Sample]]:
    named: dict[str, list[Sample]] = {}
    for sample in samples:
        named.setdefault(sample.name, []).append(sample)
    return named


def models_on(page: Families, names: Iterable[str]) -> tuple[str, ...]:
    return tuple(sorted({model_of(s.labels) for name in names for s in page.get(name, ())} - {""}))


@dataclass(frozen=True, slots=True)
class Gauge:
    """Per-engine values of one gauge on a pod's page, after the model filter; or why there are none."""

    values: Mapping[tuple[str, ...], float]  # engine identity → value (copies already collapsed)
    missing: Missing | None
    family: str = ""  # how reasons name the family (selector_text)

    def total(self) -> Value:
        if self.missing is not None:
            return self.missing
        try:
            return math.fsum(self.values.values())
        except OverflowError:
            # Engines each printing a finite value near a float's limit (two 1e308) sum beyond it: no
            # reading of the pod (UNAVAILABLE naming it and the family), never an exception (INTERNAL).
            return Missing(
                MissingKind.NO_VALUE,
                f"{self.family} adds up to more than a float holds over the pod's {len(self.values)} engines",
                self.family,
            )

    def mean(self) -> Value:
        total = self.total()
        return total if isinstance(total, Missing) else total / len(self.values)


def gauge(
    page: Families,
    name: str,
    *,
    model: str | None,
    engine_labels: Sequence[str],
    where: Mapping[str, str] = {},
) -> Gauge:
    """The per-engine values of family `name` (series matching `where`) on one pod's page.

    One engine is one (model, values of `engine_labels`): vLLM's `engine`, SGLang's `dp_rank`, Triton's
    `version`. Series that differ in anything else (`tp_rank`/`pp_rank` copies of one value, one page seen
    by two scrape jobs) are copies of that engine's value and count once: the largest copy is taken, so
    the result does not depend on series order. An engine whose samples are all unusable makes the whole
    gauge missing: summing the other engines would understate the pod.
    """
    family = selector_text(name, where)
    series = page.get(name, ())
    if where:
        series = [s for s in series if all(s.labels.get(k) == v for k, v in where.items())]
    if not series:
        return Gauge({}, Missing(MissingKind.FAMILY_ABSENT, f"{family} is not on the page", family))
    if model is not None:
        chosen = [s for s in series if model_of(s.labels) == model]
        if not chosen:
            present = sorted({model_of(s.labels) for s in series} - {""})
            on_page = ", ".join(present) if present else "none"
            near = [name for name in present if folded_model(name) == folded_model(model)]
            kind = MissingKind.MODEL_CASE if near else MissingKind.NO_MODEL
            reason = f"no {family} series has model {model!r} (models on the page: {on_page})"
            if near:
                reason += (
                    f": {model!r} differs from {near[0]!r} only in case or blanks and model names are"
                    f" compared exactly; set `model: {near[0]}`"
                )
            return Gauge({}, Missing(kind, reason, family))
        series = chosen
    per_engine = _largest_per_engine(series, engine_labels)
    unusable = [key for key, value in per_engine.items() if value is None]
    if unusable:
        key = min(unusable)  # the first in engine order, whatever the page's order
        where_engine = {"model": key[0]} if key[0] else {}
        where_engine.update((label, v) for label, v in zip(engine_labels, key[1:], strict=True) if v)
        return Gauge(
            {},
            Missing(
                MissingKind.NO_VALUE,
                f"{family} has no finite, non-negative sample for engine "
                f"{selector_text('', where_engine) or '(unlabelled)'}",
                family,
            ),
        )
    return Gauge({k: v for k, v in per_engine.items() if v is not None}, None, family)


def _largest_per_engine(
    series: Iterable[Sample], engine_labels: Sequence[str]
) -> dict[tuple[str, ...], float | None]:
    """Each engine's largest usable value (see gauge), None for an engine without any. Run on every
    sample of every family read, so kept to one pass with no call it can do without."""
    per_engine: dict[tuple[str, ...], float | None] = {}
    for sample in series:
        labels, value = sample.labels, sample.value
        key = (model_of(labels), *[labels.get(label, "") for label in engine_labels])
        if usable(value):
            before = per_engine.get(key)
            per_engine[key] = value if before is None else max(before, value)
        else:
            per_engine.setdefault(key, None)
    return per_engine


def fraction_percent(value: Value) -> Value:
    """A 0–1 fraction as a percentage clamped to 0–100 (SPEC §4's percentage rule)."""
    if isinstance(value, Missing):
        return value
    return min(100.0, max(0.0, value * 100.0))


def not_exported(engine: Engine, what: str) -> Missing:
    return Missing(MissingKind.NOT_EXPORTED, f"{engine.value} exports no {what}")


def engine_count(*gauges: Gauge) -> int:
    """How many separate engines (× models) the gauges saw on the page."""
    return len({key for g in gauges for key in g.values})


# Spellings whose disagreement was logged already: a page is read on every evaluation, and one line per
# (family, other spelling) says all there is to say. Grows by at most one entry per spelling an engine reads.
_DISAGREEMENTS_LOGGED: set[tuple[str, str]] = set()


def gauge_of_spellings(
    page: Families,
    spellings: Sequence[str],
    *,
    model: str | None,
    engine_labels: Sequence[str],
    where: Mapping[str, str] = {},
    older: str = "",
) -> Gauge:
    """One gauge printed under one name or several (a rename, a router or a Prometheus that rewrites `:`
    to `_`): see gauge() for `where`.

    The first spelling on the page is read and the others are ignored, so a page printing two spellings
    counts once. Where another spelling carries different values, the first one's stand and the
    disagreement is logged once. With none of them on the page, the Missing names the first spelling
    and lists the others (`older`: what printed them, said after them).
    """
    if len(spellings) == 1:
        return gauge(page, spellings[0], model=model, engine_labels=engine_labels, where=where)
    present = [name for name in spellings if name in page]
    if not present:
        first = spellings[0]
        others = " nor ".join(spellings[1:]) + (f" ({older})" if older else "")
        return Gauge(
            {},
            Missing(MissingKind.FAMILY_ABSENT, f"neither {first} nor {others} is on the page", first),
        )
    chosen = gauge(page, present[0], model=model, engine_labels=engine_labels, where=where)
    for other in present[1:]:
        copy = gauge(page, other, model=model, engine_labels=engine_labels, where=where)
        if copy.values != chosen.values and (present[0], other) not in _DISAGREEMENTS_LOGGED:
            _DISAGREEMENTS_LOGGED.add((present[0], other))
            log.warning(
                "a page prints both %s and %s with different values (%s against %s): reading %s "
                "(logged once)",
                present[0],
                other,
                _values_text(chosen),
                _values_text(copy),
                present[0],
            )
    return chosen


def _values_text(g: Gauge) -> str:
    if g.missing is not None:
        return g.missing.reason
    return ", ".join(f"{value:g}" for _, value in sorted(g.values.items())) or "none"


@dataclass(frozen=True, slots=True)
class PodSamples:
    """One pod's inference-server series (only the engines' families), as one page gave them."""

    namespace: str
    pod: str
    samples: tuple[Sample, ...]
    # The page's address (its URL: pod, port and path): one pod may serve several pages, one per container.
    source: str = ""
    # (format index, its demand counters) worked out with the page, off the event loop, for a large page
    # (engines.page_counters); None: worked out when wanted (what they are is the samples' alone).
    counters: tuple[int, DemandCounters] | None = field(default=None, compare=False)


# --- demand (SPEC §6, `metric: demand`): counters of finished requests and of tokens -----------------


Series = Mapping[tuple[str, ...], float]
"""A counter's series on one page: (family, model, "label=value" of each split label...) → running total."""


@dataclass(frozen=True, slots=True)
class DemandCounters:
    """One pod's counters for `metric: demand`, as one page gave them: per series (each its running
    total), or Missing. Rates are taken per series (SPEC §6), so a reset of one is never a reset of all.

    `finished`: requests finished so far, every finish reason (aborts and errors included), per engine and
    model. `prompt_tokens` / `generation_tokens`: tokens processed so far. `sizes`: where the engine prints
    per-request token histograms, their `_sum`/`_count` series (keyed by the roles in SIZE_ROLES), which
    give a request's true size; empty otherwise. A counter is never a 0 made up for a family that is absent.
    """

    finished: Series | Missing
    prompt_tokens: Series | Missing
    generation_tokens: Series | Missing
    sizes: Series = field(default_factory=dict)
    # Where the engine prints latency histograms: their bucket, _sum and _count series (see latency_series).
    latency: Series = field(default_factory=dict)


# The roles of per-request token histogram series in DemandCounters.sizes (the first item of each key).
SIZE_ROLES = ("prompt_sum", "prompt_count", "generation_sum", "generation_count")


@dataclass(frozen=True, slots=True)
class CounterFamily:
    """A counter family an engine prints, under one or more spellings, and the labels that split it.

    `split_labels`: labels whose values are separate series to add up (a finish reason, a data-parallel
    engine); series differing only in anything else are copies of one value (see gauge()).
    `optional`: the family is added where the page has it and counts for nothing where it has not (a
    failure counter that an exporter prints only once something failed).
    """

    spellings: tuple[str, ...]
    split_labels: tuple[str, ...] = ()
    optional: bool = False
    # Said where the family is absent: when the engine prints it (some print a counter only once it moved).
    absent_hint: str = ""

    @property
    def name(self) -> str:
        return self.spellings[0]


def counter_series(
    page: Families, families: Sequence[CounterFamily], *, model: str | None
) -> Series | Missing:
    """The series of the counter families on one page (see Series).

    An absent family that is not optional, or any family without a usable sample (NaN, ±Inf, negative),
    makes the answer Missing: a part left out would read as fewer requests than the pod finished.
    """
    series: dict[tuple[str, ...], float] = {}
    for family in families:
        counted = gauge_of_spellings(page, family.spellings, model=model, engine_labels=family.split_labels)
        if counted.missing is not None:
            if counted.missing.kind is not MissingKind.FAMILY_ABSENT:
                return counted.missing
            if family.optional:
                continue
            hint = f" ({family.absent_hint})" if family.absent_hint else ""
            return Missing(MissingKind.FAMILY_ABSENT, f"{counted.missing.reason}{hint}", family.name)
        series.update(
            ((family.name, key[0], *_pairs(family.split_labels, key[1:])), value)
            for key, value in counted.values.items()
        )
    return series


@functools.lru_cache(maxsize=1024)  # a page repeats the same few (label, value) pairs at every read
def _pairs(labels: tuple[str, ...], values: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(f"{label}={value}" for label, value in zip(labels, values, strict=True))


def histogram_sizes(
    page: Families, prompt: str, generation: str, split_labels: tuple[str, ...], model: str | None
) -> Series:
    """The `_sum`/`_count` series of an engine's per-request prompt and generation token histograms, keyed
    (role, model, split label values); empty where the page lacks any of the four (a request's size then
    comes from the token counters)."""
    sizes: dict[tuple[str, ...], float] = {}
    for role, name in zip(
        SIZE_ROLES,
        (f"{prompt}_sum", f"{prompt}_count", f"{generation}_sum", f"{generation}_count"),
        strict=True,
    ):
        counted = counter_series(page, (CounterFamily((name,), split_labels),), model=model)
        if isinstance(counted, Missing):
            return {}
        sizes.update(((role, *key[1:]), value) for key, value in counted.items())
    return sizes


# The latency kinds the engines' histograms carry: the time to first token, and the time per output
# token twice over, as each request's mean (TPOT: one observation per request) or as every gap between
# tokens (ITL: one observation per token). The SLO's per-output-token target (slo.py) applies to both,
# but they count different things: their buckets are never summed together.
TTFT, TPOT, ITL = "ttft", "tpot", "itl"
LATENCY_KINDS = (TTFT, TPOT, ITL)

LatencyFamilies = Mapping[str, tuple[str, ...]]
"""An engine's latency histograms: kind (slo.TTFT, slo.TPOT) → its base names, preferred first (a newer
name, another spelling): the first one on a page is read, so a page printing two counts once."""


def latency_names(families: LatencyFamilies) -> frozenset[str]:
    """The sample names of the histograms, for the page filter."""
    return frozenset(f"{b}_{part}" for bases in families.values() for b in bases for part in _HISTOGRAM_PARTS)


_HISTOGRAM_PARTS = ("bucket", "sum", "count")


def latency_series(
    page: Families,
    families: LatencyFamilies,
    split_labels: tuple[str, ...],
    model: str | None,
    per_token: frozenset[str] = frozenset(),
) -> Series:
    """The latency histograms' series, keyed (role, model, split label values): role `KIND:le=BOUND` for
    a bucket, `KIND:sum`, `KIND:count`. A kind whose histogram is absent or unusable has no series. The
    TPOT histogram read is keyed ITL when it is one of `per_token` (an observation per token)."""
    series: dict[tuple[str, ...], float] = {}
    for family_kind, bases in families.items():
        base = next((b for b in bases if f"{b}_count" in page), None)
        if base is None:
            continue
        kind = ITL if family_kind == TPOT and base in per_token else family_kind
        parts: dict[tuple[str, ...], float] = {}
        for part in _HISTOGRAM_PARTS:
            bucket = part == "bucket"
            labels = (*split_labels, "le") if bucket else split_labels
            # Read as counter_series reads one family, but keyed by role straight from the engines.
            counted = gauge(page, f"{base}_{part}", model=model, engine_labels=labels)
            if counted.missing is not None:
                break
            for (series_model, *values), value in counted.values.items():
                role = f"{kind}:le={values.pop()}" if bucket else f"{kind}:{part}"
                parts[(role, series_model, *_pairs(split_labels, tuple(values)))] = value
        else:
            series.update(parts)
    return series
