"""The evaluator's memo: a re-evaluation that gives the same result keeps the objects already held."""

from __future__ import annotations

from keda_gpu_scaler.collect.store import Page, Store
from keda_gpu_scaler.evaluator import Evaluator
from keda_gpu_scaler.registry import Followed
from keda_gpu_scaler.telemetry import Telemetry
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
    followed = Followed("llm", "vllm", now[0])
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
    assert followed.memos[SPEC].valid_until == now[0] + 15.0, "the memo itself moves on"

    store.record_page(page(now[0] + 1, 55))  # the value moved: a new result, a new explanation
    now[0] += 1
    moved = evaluator.evaluate(followed, SPEC)
    assert moved.value == 55 and moved is not first
    assert followed.explanation is not explanation and followed.explanation.evaluation is moved
