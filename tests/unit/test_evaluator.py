"""The evaluator: a pure read of the store; a re-evaluation that gives the same result keeps the objects already held."""

from __future__ import annotations

import pytest

from keda_gpu_scaler.collect.snapshot import Snapshots
from keda_gpu_scaler.collect.store import Page, Store
from keda_gpu_scaler.core.errors import NoData
from keda_gpu_scaler.core.trigger_parse import parse_trigger
from keda_gpu_scaler.pages.vendors import Family, GpuReading
from keda_gpu_scaler.server.evaluator import Evaluator
from keda_gpu_scaler.server.registry import Registry
from keda_gpu_scaler.telemetry import Telemetry

SPEC = parse_trigger({"threshold": "70", "podNamePrefix": "vllm-"})


def page(at: float, value: float) -> Page:
    reading = GpuReading(Family.NVIDIA, "llm", "vllm-0", "GPU-0", "node", value, None, False, None)
    return Page.from_readings("http://node/metrics", at, [reading])


def evaluator_at(store: Store, now: list[float]) -> Evaluator:
    snapshots = Snapshots(store=store, max_staleness=15.0, clock=lambda: now[0])
    return Evaluator(snapshots=snapshots, telemetry=Telemetry())


def test_the_same_result_again_keeps_the_evaluation_and_explanation_objects() -> None:
    now = [1000.0]
    store = Store()
    evaluator = evaluator_at(store, now)
    followed = Registry(ttl=600, cap=10, clock=lambda: now[0]).follow("llm", "vllm", SPEC)
    store.record_page(page(now[0], 40))
    first = evaluator.evaluate(followed, SPEC)
    explanation = followed.explanation
    assert explanation is not None and first.value == 40

    # The page is renewed with the same values: evaluated again, the same result.
    now[0] += 20
    store.record_page(page(now[0], 40))
    again = evaluator.evaluate(followed, SPEC)
    assert again is first, "an equal result keeps the long-lived object"
    assert followed.explanation is explanation

    store.record_page(page(now[0] + 1, 55))  # the value moved: a new result, a new explanation
    now[0] += 1
    moved = evaluator.evaluate(followed, SPEC)
    assert moved.value == 55 and moved is not first
    assert followed.explanation is not explanation and followed.explanation.evaluation is moved


def two_exporters(at: float, value: float, source: str) -> Page:
    reading = GpuReading(Family.NVIDIA, "llm", f"vllm-{source}", "GPU-0", source, value, None, False, None)
    return Page.from_readings(f"http://{source}/metrics", at, [reading])


def test_pages_renewed_unchanged_keep_the_answer_and_a_stale_page_is_no_data() -> None:
    now = [1000.0]
    store = Store()
    evaluator = evaluator_at(store, now)
    followed = Registry(ttl=600, cap=10, clock=lambda: now[0]).follow("llm", "vllm", SPEC)
    store.record_page(page(now[0], 40))
    first = evaluator.evaluate(followed, SPEC)
    for _ in range(5):  # an exporter refreshing slower than it is scraped: the same readings, later
        now[0] += 10
        store.record_page(page(now[0], 40))
        assert evaluator.evaluate(followed, SPEC) is first, "the same result keeps its object"

    now[0] += 20  # the page is stale now: no data
    with pytest.raises(NoData):
        evaluator.evaluate(followed, SPEC)


def test_a_source_fresh_again_with_the_page_it_had_is_read_at_once() -> None:
    """Its page moves no version of the store (same readings), yet its pod reports again at once."""
    now = [1000.0]
    store = Store()
    evaluator = evaluator_at(store, now)
    followed = Registry(ttl=600, cap=10, clock=lambda: now[0]).follow("llm", "vllm", SPEC)
    store.record_page(two_exporters(now[0], 40, "a"))
    store.record_page(two_exporters(now[0], 30, "b"))
    now[0] += 20  # b is not scraped meanwhile (no failure either): stale from 1015
    store.record_page(two_exporters(now[0], 40, "a"))
    # b's pod is missing and a's 40 is under the target: the missing pod counts as the target (70).
    assert evaluator.evaluate(followed, SPEC).value == 110.0
    now[0] += 1
    store.record_page(two_exporters(now[0], 30, "b"))
    assert evaluator.evaluate(followed, SPEC).value == 70.0
