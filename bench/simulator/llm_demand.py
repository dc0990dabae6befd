"""The simulated pages handed to the product's own arithmetic: SPEC §4's rule for target, missing and
starting pods (scaling.evaluate) and SPEC §6's demand (demand.pod_demand, demand_values.with_pending)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

from bench.simulator.llm_signals import View
from keda_gpu_scaler.demand import DemandPoint, DemandUnit, growth_per_second, over_window, pod_demand
from keda_gpu_scaler.demand_values import with_pending
from keda_gpu_scaler.engines import Missing
from keda_gpu_scaler.errors import NoData
from keda_gpu_scaler.scaling import Evaluation, evaluate, pod_row
from keda_gpu_scaler.trigger import Aggregation, TriggerSpec


def evaluate_pods(
    values: dict[str, float], missing: int, starting: int, spec: TriggerSpec
) -> Evaluation | None:
    """The product's evaluation of the Ready pods' values (sum), `missing` Ready pods without a value and
    `starting` pods not Ready yet. None: UNAVAILABLE (NoData)."""
    rows = {pod: pod_row(pod, "vllm", value) for pod, value in values.items()}
    try:
        return evaluate(
            rows,
            [f"missing-{i}" for i in range(missing)],
            spec,
            Aggregation.SUM,
            [f"starting-{i}" for i in range(starting)],
        )
    except NoData:
        return None


def points(scrapes: Sequence[View] | deque[View], pod: str) -> list[DemandPoint]:
    """One pod's pages as the product's demand reads them, oldest first."""
    return [
        DemandPoint(
            view.at,
            float(page.finished),
            float(page.running + page.waiting),
            float(page.prompt_tokens),
            page.generation_tokens,
        )
        for view in scrapes
        if (page := view.pages.get(pod)) is not None
    ]


def pod_rates(scrapes: Sequence[View] | deque[View], spec: TriggerSpec) -> dict[str, float | None]:
    """λ per Ready pod of the newest scrape, by demand.pod_demand over the window; None: no rate yet."""
    if not scrapes:
        return {}
    rates: dict[str, float | None] = {}
    for pod in scrapes[-1].pages:
        rate = pod_demand(
            over_window(points(scrapes, pod), spec.window), spec.demand_unit, spec.prefill_weight
        )
        rates[pod] = None if isinstance(rate, Missing) else rate
    return rates


def with_mean_of_others(rates: dict[str, float | None]) -> dict[str, float] | None:
    """A Ready pod without a rate counts as the mean of the others; None: none has one (UNAVAILABLE)."""
    known = [r for r in rates.values() if r is not None]
    if not known:
        return None if rates else {}
    mean = math.fsum(known) / len(known)
    return {pod: mean if r is None else r for pod, r in rates.items()}


def pending_points(
    history: Sequence[tuple[float, int]] | deque[tuple[float, int]], window: float
) -> list[tuple[float, float]]:
    """The pool's pending requests over the window, oldest first (from the newest read a window old)."""
    if not history:
        return []
    boundary = history[-1][0] - window
    kept = [(t, float(p)) for t, p in history if t >= boundary]
    older = [(t, float(p)) for t, p in history if t < boundary]
    return older[-1:] + kept


def tokens_per_request(scrapes: Sequence[View] | deque[View], spec: TriggerSpec, fallback: float) -> float:
    """Weighted tokens per finished request over the window, over the Ready pods (`fallback` with none)."""
    work = finished = 0.0
    for pod in scrapes[-1].pages if scrapes else ():
        track = over_window(points(scrapes, pod), spec.window)
        if len(track) > 1 and track[-1].finished > track[0].finished:
            first, last = track[0], track[-1]
            prompt = (last.prompt_tokens or 0.0) - (first.prompt_tokens or 0.0)
            generated = (last.generation_tokens or 0.0) - (first.generation_tokens or 0.0)
            work += spec.prefill_weight * prompt + generated
            finished += last.finished - first.finished
    return work / finished if finished > 0 else fallback


def demand_value(
    scrapes: Sequence[View] | deque[View],
    pending: Sequence[tuple[float, int]] | deque[tuple[float, int]] | None,
    spec: TriggerSpec,
    request_size: float = 1.0,
) -> float | None:
    """The trigger's value as the product computes it: pods' demand through evaluate, then pending.

    `request_size`: weighted tokens per request where none finished within the window (tokens only); in
    tokens the pending requests are weighed by the pods' tokens per request, as the product does."""
    view = scrapes[-1] if scrapes else View(-1.0)
    values = with_mean_of_others(pod_rates(scrapes, spec))
    if values is None:
        return None
    missing = len(set(view.targets) - view.pages.keys())
    evaluation = evaluate_pods(values, missing, len(view.starting), spec)
    if evaluation is None:
        return None
    if pending is not None:
        held = pending_points(pending, spec.window)
        size = (
            tokens_per_request(scrapes, spec, request_size) if spec.demand_unit is DemandUnit.TOKENS else None
        )
        last = held[-1][1] if held else 0.0
        evaluation, _ = with_pending(evaluation, spec, growth_per_second(held), last, size)
    return evaluation.value
