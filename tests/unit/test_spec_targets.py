"""A ScaledObject's current targets: the metadata's threshold until moved, moves published once a minute."""

from __future__ import annotations

from keda_gpu_scaler.core.trigger_parse import parse_trigger
from keda_gpu_scaler.server.spec_targets import SPEC_UPDATE_INTERVAL, CurrentTargets

SPEC = parse_trigger({"podNamePrefix": "vllm-", "threshold": "70"})
OTHER = parse_trigger({"podNamePrefix": "vllm-", "threshold": "40", "metric": "memory"})


def test_moves_of_several_triggers_are_published_together_at_most_once_a_minute() -> None:
    now = [0.0]
    targets = CurrentTargets(lambda: now[0])
    assert (targets.target(SPEC), targets.version) == (70, 0)
    targets.set(SPEC, 70)  # no move: the minute is not used up
    assert targets.version == 0
    targets.set(SPEC, 80)
    assert (targets.target(SPEC), targets.version) == (80, 1)
    now[0] = SPEC_UPDATE_INTERVAL - 1
    targets.set(SPEC, 90)
    targets.set(OTHER, 50)
    assert (targets.target(SPEC), targets.target(OTHER), targets.due_in()) == (80, 40, 1)
    now[0] = SPEC_UPDATE_INTERVAL
    assert (targets.target(SPEC), targets.target(OTHER), targets.version) == (90, 50, 2)


def test_a_forgotten_trigger_is_back_at_its_threshold() -> None:
    targets = CurrentTargets(lambda: 0.0)
    targets.set(SPEC, 80)
    targets.forget(SPEC)
    assert targets.target(SPEC) == 70
