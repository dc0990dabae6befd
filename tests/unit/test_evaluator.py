"""The evaluator's memo: a re-evaluation that gives the same result keeps the objects already held."""

from __future__ import annotations

from typing import Any

import pytest

from keda_gpu_scaler.collect.store import Page, Store
from keda_gpu_scaler.errors import NoData
from keda_gpu_scaler.evaluator import Evaluator
from keda_gpu_scaler.metrics import Telemetry
from keda_gpu_scaler.registry import Registry
from keda_gpu_scaler.trigger import parse_trigger
from keda_gpu_scaler.vendors import Family, GpuReading

SPEC = parse_trigger({"threshold": "70", "podNamePrefix": "vllm-"})


def page(at: float, value: float) -> Page:
    reading = GpuReading(Family.NVIDIA, "llm", "vllm-0", "GPU-0", "node", value, None, False, None)
    return Page.from_readings("http://node/metrics", at, [reading])


def test_the_same_result_again_keeps_the_evaluation_and_explanation_objects() -> None:
    now = [1000.0]
    store = Store()
    evaluator = Evaluator(store=store, telemetry=Telemetry(), max_staleness=15.0, clock=lambda: now[0])
    followed = Registry(ttl=600, cap=10, clock=lambda: now[0]).follow("llm", "vllm", SPEC)
    store.record_page(page(now[0], 40))
    first = evaluator.evaluate(followed, SPEC)
    explanation = followed.explanation
    assert explanation is not None and first.value == 40

    # The page is renewed with the same values and the memo's time is up: evaluated again, same result.
    now[0] += 20
    store.record_page(page(now[0], 40))
    again = evaluator.evaluate(followed, SPEC)
    assert again is first, "an equal result keeps the long-lived object"
    assert followed.explanation is explanation
    assert followed.triggers[SPEC].memo.valid_until == now[0] + 15.0, "the memo itself moves on"

    store.record_page(page(now[0] + 1, 55))  # the value moved: a new result, a new explanation
    now[0] += 1
    moved = evaluator.evaluate(followed, SPEC)
    assert moved.value == 55 and moved is not first
    assert followed.explanation is not explanation and followed.explanation.evaluation is moved


def counting_evaluator(store: Store, now: list[float]) -> tuple[Evaluator, list[int]]:
    evaluator = Evaluator(store=store, telemetry=Telemetry(), max_staleness=15.0, clock=lambda: now[0])
    calls = [0]
    real = evaluator._evaluate

    def counting(*args: Any) -> Any:
        calls[0] += 1
        return real(*args)

    evaluator._evaluate = counting  # type: ignore[method-assign]
    return evaluator, calls


def two_exporters(at: float, value: float, source: str) -> Page:
    reading = GpuReading(Family.NVIDIA, "llm", f"vllm-{source}", "GPU-0", source, value, None, False, None)
    return Page.from_readings(f"http://{source}/metrics", at, [reading])


def test_pages_renewed_unchanged_keep_the_answer_and_a_stale_page_is_no_data() -> None:
    now = [1000.0]
    store = Store()
    evaluator, calls = counting_evaluator(store, now)
    followed = Registry(ttl=600, cap=10, clock=lambda: now[0]).follow("llm", "vllm", SPEC)
    store.record_page(page(now[0], 40))
    first = evaluator.evaluate(followed, SPEC)
    evaluator.evaluate(followed, SPEC)
    assert calls[0] == 1, "nothing moved: the memo answers"
    for _ in range(5):  # an exporter refreshing slower than it is scraped: the same readings, later
        now[0] += 10
        store.record_page(page(now[0], 40))
        assert evaluator.evaluate(followed, SPEC) is first, "the same result keeps its object"

    now[0] += 20  # the page is stale now: no data
    with pytest.raises(NoData):
        evaluator.evaluate(followed, SPEC)


def test_a_source_fresh_again_with_the_page_it_had_is_read_at_once() -> None:
    """Its page moves no version (same readings), yet the memo made while it was stale is not right."""
    now = [1000.0]
    store = Store()
    evaluator, calls = counting_evaluator(store, now)
    followed = Registry(ttl=600, cap=10, clock=lambda: now[0]).follow("llm", "vllm", SPEC)
    store.record_page(two_exporters(now[0], 40, "a"))
    store.record_page(two_exporters(now[0], 30, "b"))
    now[0] += 20  # b is not scraped meanwhile (no failure either): stale from 1015
    store.record_page(two_exporters(now[0], 40, "a"))
    assert evaluator.evaluate(followed, SPEC).value == 110.0, "b's pod missing, at the threshold"
    now[0] += 1
    store.record_page(two_exporters(now[0], 30, "b"))  # the memo's time (a's page + 15 s) is not up
    assert evaluator.evaluate(followed, SPEC).value == 70.0
    assert calls[0] == 2


def test_a_source_fresh_again_is_evaluated_again() -> None:
    now = [1000.0]
    store = Store()
    evaluator, calls = counting_evaluator(store, now)
    followed = Registry(ttl=600, cap=10, clock=lambda: now[0]).follow("llm", "vllm", SPEC)
    store.record_page(two_exporters(now[0], 40, "a"))
    store.record_page(two_exporters(now[0], 30, "b"))
    now[0] += 10
    store.record_page(two_exporters(now[0], 40, "a"))  # b is not renewed: stale from 1015
    now[0] += 10
    store.record_page(two_exporters(now[0], 40, "a"))
    without_b = evaluator.evaluate(followed, SPEC)  # b's pod counts as missing (stale source)
    assert calls[0] == 1
    now[0] += 10
    store.record_page(two_exporters(now[0], 30, "b"))  # b answers again with what it had: same version
    now[0] += 6  # the memo's time is up (a's page of 1020 + 15 s); a renewed, b still fresh
    store.record_page(two_exporters(now[0], 40, "a"))
    again = evaluator.evaluate(followed, SPEC)
    assert calls[0] == 2, "another source is fresh: the view differs, so it is evaluated again"

    # b's pod missing (counted at the threshold, 70), then reporting its own 30 again.
    assert (without_b.value, again.value) == (110.0, 70.0)
