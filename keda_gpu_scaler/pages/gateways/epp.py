"""The inference gateway's endpoint picker (EPP) of llm-d's router and the Gateway API Inference
Extension: requests its flow-control queue holds for an InferencePool (SPEC §7)."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from functools import lru_cache

from keda_gpu_scaler.pages import exposition
from keda_gpu_scaler.pages.exposition import Sample
from keda_gpu_scaler.pages.gateways import epp_flow
from keda_gpu_scaler.pages.gateways._common import (
    OTHER,
    GatewayProblem,
    NotAGatewayPage,
    PoolQueue,
    QueueMissing,
    QueueReading,
    QueueTable,
)

NAME = "epp"

# llm-d-router docs/metrics.md (v0.10.0): a gauge labelled fairness_id, priority, inference_pool,
# model_name, target_model_name. Older EPPs (the Inference Extension's, before the move to llm-d) print
# the same gauge under their own prefix; a page with both counts once, the current name preferred.
QUEUE = "llm_d_epp_flow_control_queue_size"
QUEUE_OLD = "inference_extension_flow_control_queue_size"
QUEUE_FAMILIES = (QUEUE, QUEUE_OLD)
LEVEL_FAMILIES = QUEUE_FAMILIES  # read as levels: a page declaring another type for them is refused

# Families printed while flow control runs, queue or no queue, under either generation's prefix. The
# queue gauge's series appear only once a request was queued with their labels, so a freshly started EPP
# with flow control on prints no queue series yet: these tell it from one with flow control off (an idle
# older EPP is 0, not "off"). The dispatch cycle runs while flow control does, requests or none.
SATURATION = epp_flow.SATURATION
REQUESTS_TOTAL = epp_flow.REQUESTS_TOTAL
FLOW_CONTROL_SIGNS = frozenset(
    {
        *epp_flow.FAMILIES,
        "llm_d_epp_flow_control_dispatch_cycle_duration_seconds_count",
        "inference_extension_flow_control_dispatch_cycle_duration_seconds_count",
    }
)

# Families every EPP prints whatever its feature gates: a page with none of them, and no queue, is not an
# EPP's page. Not llm_d_epp_request_running: at the EPP's caps it has one series per model and fairness
# id, as many as the queue, and would be parsed for nothing.
READY_ENDPOINTS = "llm_d_epp_ready_endpoints"
READY_PODS_OLD = "inference_pool_ready_pods"
IDENTITY = frozenset({READY_ENDPOINTS, READY_PODS_OLD})
REQUEST_RUNNING = "llm_d_epp_request_running"  # never read; named for the simulated pages

# Every family read: the queue, and the families whose presence tells an EPP and its flow control.
SAMPLE_NAMES = frozenset({*QUEUE_FAMILIES, *FLOW_CONTROL_SIGNS, *IDENTITY})

POOL_LABEL = "inference_pool"
MODEL_LABEL = "model_name"
TARGET_MODEL_LABEL = "target_model_name"

FLOW_CONTROL_OFF = (
    "the endpoint picker holds no requests: its flow control is off (none of its flow-control families"
    f" such as {QUEUE} is on its page). Enable the EPP's `flowControl` feature gate"
    " (featureGates: [flowControl]) so it queues requests while the pool has no endpoint"
)

# client_golang (the EPP's registry) prints a series' labels sorted by name and a family's lines one after
# the other: `NAME{fairness_id="…",inference_pool="…",model_name="…",priority="…",target_model_name="…"} V`.
# That layout is taken apart by splitting the family's lines at their quotes (C speed: 10,000 series in a
# few ms, where a regular expression took 25). Anything else (other labels or order, an escape, a
# timestamp, another line in between) sends the family through the general parser, so the fast path only
# ever changes the speed, never the result.
_LAYOUT = ("fairness_id", POOL_LABEL, MODEL_LABEL, "priority", TARGET_MODEL_LABEL)
_SEPARATORS = tuple(f",{label}=" for label in _LAYOUT[1:])
Columns = tuple[list[str], list[str], list[str], list[str], list[str], list[str]]
"""The five labels in _LAYOUT order, and the values as printed, one entry per series."""


def model_of(model_name: str, target_model_name: str) -> str:
    """The model a queued request is for: the target model, or where that label is empty the model."""
    return target_model_name or model_name


def table_from_samples(samples: Sequence[Sample]) -> QueueTable:
    """The queue of parsed samples (a Prometheus answer's series of one replica): as queue_table reads
    a page. Raises NotAGatewayPage for one series given twice with different values."""
    present = {sample.name for sample in samples}
    family = next((name for name in QUEUE_FAMILIES if name in present), None)
    if family is None:
        return _with_signals(QueueTable(NAME, None, bool(present & FLOW_CONTROL_SIGNS), ()), samples)
    ours = _distinct([s for s in samples if s.name == family], family)
    found = _totals(_columns(ours), family, values=[s.value for s in ours], distinct=True)
    assert found is not None  # values given: nothing left to fail
    return _with_signals(QueueTable(NAME, family, True, *found), samples)


def _with_signals(table: QueueTable, samples: Sequence[Sample]) -> QueueTable:
    """`table` with the flow-control signals beside the queue: turned-away counters and saturation (the
    counters' growth is set later, against the replica's previous page: see gateways.since)."""
    return dataclasses.replace(
        table, turned_away=epp_flow.turned_away(samples), saturation=epp_flow.saturation(samples)
    )


def _distinct(samples: Sequence[Sample], family: str) -> list[Sample]:
    """One sample per series, a series being its whole label set: series that differ only by a label
    this reader does not know (a `shard`, say) are distinct and both count. The same series printed
    twice counts once, or fails the page when its two values differ (either could be wrong)."""
    seen: dict[frozenset[tuple[str, str]], Sample] = {}
    for sample in samples:
        before = seen.setdefault(frozenset(sample.labels.items()), sample)
        if before.value != sample.value and not (math.isnan(before.value) and math.isnan(sample.value)):
            raise NotAGatewayPage(
                f"{family}{{{epp_flow.series_text(sample.labels)}}} is printed twice, with {before.value!r} and"
                f" {sample.value!r}: either could be wrong"
            )
    return list(seen.values())


def _columns(samples: Sequence[Sample]) -> Columns:
    return (
        [s.labels.get(_LAYOUT[0], "") for s in samples],
        [s.labels.get(_LAYOUT[1], "") for s in samples],
        [s.labels.get(_LAYOUT[2], "") for s in samples],
        [s.labels.get(_LAYOUT[3], "") for s in samples],
        [s.labels.get(_LAYOUT[4], "") for s in samples],
        [repr(s.value) for s in samples],
    )


def queue_table(body: bytes, max_series: int) -> QueueTable:
    """What an EPP page says about its queue (whether its other families are on the page is looked up in
    the text, not parsed).

    Raises NotAGatewayPage for a page that is not an EPP's, more than `max_series` queue series, or
    one series printed twice with different values (either could be the wrong one)."""
    text = body.decode("utf-8", "replace")
    indented = _indentation(text)
    signals = _signal_samples(body, text, indented)
    for family in QUEUE_FAMILIES:
        table = _family_table(body, text, family, max_series, indented)
        if table is not None:
            return _with_signals(QueueTable(NAME, family, True, *table), signals)
    names = {sample.name for sample in signals}
    # Each family looked up until one is found: every look-up is a pass over the page.
    flow_control = bool(names & FLOW_CONTROL_SIGNS) or any(
        _count_lines(text, n, indented) for n in FLOW_CONTROL_SIGNS
    )
    if (
        not flow_control
        and not names & IDENTITY
        and not any(_count_lines(text, n, indented) for n in IDENTITY)
    ):
        raise NotAGatewayPage("no endpoint-picker (EPP) metrics on this page")
    return _with_signals(QueueTable(NAME, None, flow_control, ()), signals)


def _signal_samples(body: bytes, text: str, indented: bool) -> list[Sample]:
    """The turned-away counters and saturation of a page: their few lines picked out of the text and
    parsed alone; where some line is not in the plain layout, the general parser reads the page."""
    # A page without a family's stem (one pass) needs no look-up of either spelling.
    counted = {
        family: _count_lines(text, family, indented)
        for stem, spellings in _SIGNAL_STEMS
        if stem in text
        for family in spellings
    }
    families = {family for family, lines in counted.items() if lines}
    if not families:
        return []
    picked: list[str] = []
    for family in families:
        lines = _plain_lines(text, family, counted[family])
        if lines is None:
            picked = []
            break
        picked.extend(lines)
    page: str | bytes = "\n".join(picked) + "\n" if picked else body
    try:
        return exposition.parse_exposition(
            page, families, max_samples=MAX_SIGNAL_SERIES, reject_conflicts=True
        )
    except exposition.ExpositionError as error:
        raise NotAGatewayPage(str(error)) from None


_SIGNAL_STEMS = (
    ("_flow_control_requests_total", (epp_flow.REQUESTS_TOTAL, epp_flow.REQUESTS_TOTAL_OLD)),
    ("_flow_control_pool_saturation", (epp_flow.SATURATION, epp_flow.SATURATION_OLD)),
)
# Outcomes × priorities × pools: a few dozen series; far more is not a real page.
MAX_SIGNAL_SERIES = 10_000


def _plain_lines(text: str, family: str, count: int) -> list[str] | None:
    """The lines `NAME{…} VALUE` of a family, or None when not all of its `count` lines are of that form."""
    head = f"{family}{{"
    starts = [0] if text.startswith(head) else []
    at = text.find("\n" + head)
    while at >= 0:
        starts.append(at + 1)
        at = text.find("\n" + head, at + 1)
    if len(starts) != count:
        return None
    ends = [text.find("\n", start) for start in starts]
    return [text[start : end if end >= 0 else len(text)] for start, end in zip(starts, ends, strict=True)]


def _family_table(
    body: bytes, text: str, family: str, max_series: int, indented: bool
) -> tuple[tuple[tuple[str, str, float], ...], tuple[tuple[str, str, str], ...]] | None:
    """One queue family's (totals, unusable), or None when the page has no series of it."""
    lines = _count_lines(text, family, indented)
    if lines == 0:
        return None
    if lines > max_series:
        raise NotAGatewayPage(f"{family} has {lines:,} series; at most {max_series:,} are read")
    columns = _fast_columns(text, family, lines)
    if columns is not None:
        fast = _totals(columns, family)
        if fast is not None:
            return fast
    # Not client_golang's layout: the general parser, which also names a broken line.
    try:
        samples = exposition.parse_exposition(body, {family}, max_samples=max_series, reject_conflicts=True)
    except exposition.ExpositionError as error:
        raise NotAGatewayPage(str(error)) from None
    ours = _distinct([s for s in samples if s.name == family], family)
    found = _totals(_columns(ours), family, values=[s.value for s in ours], distinct=True)
    assert found is not None  # values given: nothing left to fail
    return found if ours else None


def _indentation(text: str) -> bool:
    """Whether some line of the page starts with a blank. Worked out once per page, in pieces: a search
    for a newline and a blank takes 4 ms over a 3 MB page (every newline is a candidate), 12 ms in one
    call over 16 MB."""
    return exposition.has_blank_led_line(text)


def _count_lines(text: str, family: str, indented: bool) -> int:
    """Lines holding a sample of `family` (with or without labels), counted without reading them.
    `indented`: _indentation(text)."""
    count = text.count(f"\n{family}{{")
    # Unlabelled samples are rare: looked for only where some line starts with the name and no "{"
    # (another family whose name starts with this one's, or an unlabelled sample).
    if text.count(f"\n{family}") != count:
        count += text.count(f"\n{family} ") + text.count(f"\n{family}\t")
    count += 1 if text.startswith((f"{family}{{", f"{family} ", f"{family}\t")) else 0
    if indented:
        # The format allows blanks before a sample's name: such lines count too (and are left to the
        # general parser, since they are not in client_golang's layout). Searched in pieces: one pass
        # over a 16 MB page would hold the GIL for tens of ms.
        count += exposition.count_in_pieces(_indented(family), text)
    return count


@lru_cache(maxsize=16)
def _indented(family: str) -> re.Pattern[str]:
    return re.compile(rf"^[ \t]+{re.escape(family)}(?=[{{ \t])", re.MULTILINE)


# More characters per queue line than any EPP prints (five label values and a number).
MAX_LINE_CHARS = 4096


def _fast_columns(text: str, family: str, lines: int) -> Columns | None:
    """The family's series as columns when all `lines` of them are in client_golang's layout, else None."""
    head = f"{family}{{{_LAYOUT[0]}="
    first = 0 if text.startswith(head) else text.find("\n" + head) + 1
    last = text.rfind("\n" + head) + 1
    if first <= 0 and not text.startswith(head):
        return None
    end = text.find("\n", max(first, last))
    if (end if end >= 0 else len(text)) - first > MAX_LINE_CHARS * lines:
        # The family's lines are not together (other lines between them): not client_golang's layout,
        # and splitting what lies between would be one long call over most of the page.
        return None
    span = text[first : end if end >= 0 else None]
    if "\\" in span:
        return None  # an escaped quote would move the split
    tokens = span.split('"')
    if len(tokens) != 10 * lines + 1 or tokens[0] != head:
        return None
    for at, separator in enumerate(_SEPARATORS, start=1):
        if set(tokens[2 * at :: 10]) != {separator}:
            return None
    # Between one series' last label and the next one's first: `} VALUE\n` and the next line's head.
    joints = tokens[10::10]
    between = "\n" + head
    cut = len(between)
    # Each joint is "} " VALUE, then (all but the last) the next line's head. Counted over all of them
    # at once rather than looked at one by one: a joint that lacks its "} " or its head leaves another
    # with two, whose value then holds that text and is not a number (_totals sends the family to the
    # general parser). No "_": float() would read "1_000", which the text format does not allow.
    inner = joints[:-1]
    joined = "".join(joints)
    if (
        joined.count("} ") != len(joints)
        or joined.count(between) != len(inner)
        or joined.count("\n") != len(inner)
    ):
        return None
    values = [j[2:-cut] for j in inner]
    values.append(joints[-1][2:])
    if "_" in "".join(values):
        return None
    return tokens[1::10], tokens[3::10], tokens[5::10], tokens[7::10], tokens[9::10], values


def _totals(
    columns: Columns, family: str, values: list[float] | None = None, distinct: bool = False
) -> tuple[tuple[tuple[str, str, float], ...], tuple[tuple[str, str, str], ...]] | None:
    """Sum usable values per (pool, model); None when a printed value is not a plain number (a timestamp
    after it, say), for the general parser to read. A series printed twice counts once, or fails the
    page when its two values differ. `distinct`: the series are already one per whole label set (the
    five columns alone may repeat: other labels tell them apart)."""
    fairness, pools, models, priorities, targets, texts = columns
    if values is None:
        try:
            values = list(map(float, texts))
        except ValueError:
            return None
    # A series printed twice: screened on three of its five labels (an EPP prints one series per
    # fairness id, priority and target model of its pool), then looked for exactly where that collides.
    if (
        not distinct
        and len(set(zip(fairness, priorities, targets, strict=True))) != len(values)
        and len(set(zip(fairness, pools, models, priorities, targets, strict=True))) != len(values)
    ):
        keys, values = _once(
            list(zip(fairness, pools, models, priorities, targets, strict=True)), values, family
        )
        fairness, pools, models, priorities, targets = (list(column) for column in zip(*keys, strict=True))
    unusable: list[tuple[str, str, str]] = []
    # All usable (finite, >= 0) in two C-speed passes: a NaN or an infinity makes the sum non-finite.
    if values and not (math.isfinite(sum(values)) and min(values) >= 0):
        keys = list(zip(fairness, pools, models, priorities, targets, strict=True))
        usable = [0 <= value < math.inf for value in values]
        unusable = [
            (key[1], key[4] or key[2], f"{_series(family, key)} {value!r}")
            for key, value, ok in zip(keys, values, usable, strict=True)
            if not ok
        ]
        keys = [key for key, ok in zip(keys, usable, strict=True) if ok]
        values = [value for value, ok in zip(values, usable, strict=True) if ok]
        _, pools, models, _, targets = (
            (list(column) for column in zip(*keys, strict=True)) if keys else ([],) * 5
        )
    # The model of a series is its target model, where empty its model name.
    chosen = targets if "" not in set(targets) else [t or m for t, m in zip(targets, models, strict=True)]
    totals: dict[tuple[str, str], float] = {}
    if len(set(pools)) == 1:  # one EPP serves one pool: sum by model alone (no key tuple per series)
        by_model: dict[str, float] = {}
        get = by_model.get
        for model, value in zip(chosen, values, strict=True):
            by_model[model] = get(model, 0.0) + value
        totals = {(pools[0], model): total for model, total in by_model.items()}
    else:
        get_total = totals.get
        for pool, model, value in zip(pools, chosen, values, strict=True):
            totals[(pool, model)] = get_total((pool, model), 0.0) + value
    return tuple(sorted((pool, model, v) for (pool, model), v in totals.items())), tuple(unusable)


def _once(
    keys: list[tuple[str, str, str, str, str]], values: list[float], family: str
) -> tuple[list[tuple[str, str, str, str, str]], list[float]]:
    seen: dict[tuple[str, str, str, str, str], float] = {}
    for key, value in zip(keys, values, strict=True):
        before = seen.setdefault(key, value)
        if before != value and not (math.isnan(before) and math.isnan(value)):
            raise NotAGatewayPage(
                f"{_series(family, key)} is printed twice, with {before!r} and {value!r}: either could be wrong"
            )
    return list(seen), list(seen.values())


def _series(family: str, key: tuple[str, str, str, str, str]) -> str:
    names = ("fairness_id", POOL_LABEL, MODEL_LABEL, "priority", TARGET_MODEL_LABEL)
    return family + "{" + ",".join(f'{k}="{v}"' for k, v in zip(names, key, strict=True)) + "}"


def read(table: QueueTable, pool: str, namespace: str, model: str | None) -> QueueReading:
    """The requests this EPP replica holds for `pool` (of `namespace`), for `model` or all models.

    Series labelled with another pool are not this pool's; series without the label are (one EPP serves
    one pool). Series folded to `other` by the EPP's cardinality cap count for every `model`. Requests
    turned away for want of an endpoint since the previous page count for every model too (the counter
    has no model label)."""
    ours = ("", pool, f"{namespace}/{pool}")
    turned_away = sum(count for name, count in table.grown if name in ours)
    saturation = tuple((stage, value) for name, stage, value in table.saturation if name in ours)
    if table.family is None:
        if not table.flow_control:
            return QueueMissing(GatewayProblem.FLOW_CONTROL_OFF, FLOW_CONTROL_OFF)
        # Flow control runs and has never queued anything, unless the pool its other series name is
        # another: then it is that pool's idle picker, as a busy page's queue series would say.
        named = {name for name, _, _ in table.saturation} | {name for name, _, _ in table.turned_away}
        named.discard("")
        if named and not named & set(ours):
            return QueueMissing(
                GatewayProblem.OTHER_POOL,
                f"the endpoint picker's flow-control series name InferencePool {', '.join(sorted(named))},"
                f" not {pool}: this is another pool's endpoint picker",
            )
        return PoolQueue(0.0, (), None, turned_away=turned_away, saturation=saturation)
    mine = [row for row in table.totals if row[0] in ours]
    bad = [row for row in table.unusable if row[0] in ours]
    if not mine and not bad:
        others = ", ".join(sorted({row[0] for row in (*table.totals, *table.unusable)}))
        return QueueMissing(
            GatewayProblem.OTHER_POOL,
            f"{table.family} names InferencePool {others}, not {pool}: this is another pool's endpoint picker",
        )
    for _, name, series in bad:
        if model is None or name in (model, OTHER, ""):
            return QueueMissing(
                GatewayProblem.NO_VALUE, f"{series}: a queue size must be a finite count >= 0"
            )
    by_model: dict[str, float] = {}
    other_counted = False
    for _, name, count in mine:
        # Past the picker's cardinality cap (`other`), or printed with no model label (older pickers):
        # any model may be among them, so they count for every model.
        folded = name in (OTHER, "")
        if model is not None and name != model and not folded:
            continue
        if folded and model is not None and model != OTHER and count > 0:
            other_counted = True
        by_model[name] = by_model.get(name, 0.0) + count
    return PoolQueue(
        sum(by_model.values()),
        tuple(sorted(by_model.items())),
        table.family,
        other_counted,
        turned_away,
        saturation,
    )
