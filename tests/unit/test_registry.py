"""The registry: one owner per ScaledObject, one TTL that forgets everything, a cap, valid names only."""

from __future__ import annotations

import grpc
import pytest

from keda_gpu_scaler.core.errors import (
    ConfigError,
    NoData,
    ResourceExhausted,
    TooManyScaledObjects,
    TooManyStreams,
)
from keda_gpu_scaler.core.scaling import evaluate
from keda_gpu_scaler.core.trigger import Aggregation, TriggerSpec
from keda_gpu_scaler.core.trigger_parse import parse_trigger
from keda_gpu_scaler.server.registry import (
    MAX_TRIGGERS_PER_SCALEDOBJECT,
    ROOM_AFTER_SECONDS,
    Explanation,
    Registry,
)
from keda_gpu_scaler.server.service import status_for

SPEC = parse_trigger({"threshold": "70", "podNamePrefix": "vllm-"})
EVALUATION = evaluate({}, (), SPEC, Aggregation.SUM)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class RecordingTracker:
    def __init__(self) -> None:
        self.tracked: set[tuple[str, str]] = set()
        self.forgotten: list[tuple[str, str]] = []
        # The ScaledObject's triggers as discovery last read them (None: not read yet).
        self.current: set[TriggerSpec] | None = None

    def track(self, namespace: str, name: str) -> None:
        self.tracked.add((namespace, name))

    def forget(self, namespace: str, name: str) -> None:
        self.tracked.discard((namespace, name))
        self.forgotten.append((namespace, name))

    def is_current(self, namespace: str, name: str, spec: TriggerSpec) -> bool | None:
        return None if self.current is None else spec in self.current


def make_registry(clock: Clock, cap: int = 100, ttl: float = 600.0):  # type: ignore[no-untyped-def]
    tracker = RecordingTracker()
    forgotten: list[str] = []
    registry = Registry(
        ttl=ttl,
        cap=cap,
        clock=clock,
        tracker=tracker,
        on_forget=lambda followed: forgotten.append(followed.name),
    )
    return registry, tracker, forgotten


def test_follow_keeps_one_entry_per_scaledobject_and_tells_discovery() -> None:
    clock = Clock()
    registry, tracker, _ = make_registry(clock)
    first = registry.follow("llm", "vllm", SPEC)
    assert registry.follow("llm", "vllm", SPEC) is first
    assert len(registry) == 1
    assert tracker.tracked == {("llm", "vllm")}


def test_ttl_forgets_every_piece_of_state_together() -> None:
    clock = Clock()
    registry, tracker, forgotten = make_registry(clock, ttl=600)
    entry = registry.follow("llm", "old", SPEC)
    entry.triggers[SPEC].explanation = Explanation(SPEC, 0.0, EVALUATION, None)
    entry.triggers[SPEC].metric_labels = ("llm", "old", "gpu-utilization")
    clock.now += 300
    registry.follow("llm", "young", SPEC)
    clock.now += 301  # "old" is past the TTL, "young" is not
    assert registry.evict_expired() == 1
    assert registry.get("llm", "old") is None
    assert registry.get("llm", "young") is not None
    assert tracker.forgotten == [("llm", "old")]
    assert forgotten == ["old"]
    # A call for it again starts from nothing: no explanation, no labels, no notes survive.
    again = registry.follow("llm", "old", SPEC)
    assert again is not entry
    assert again.triggers[SPEC].explanation is None and again.triggers[SPEC].metric_labels is None


def test_a_call_keeps_a_scaledobject_alive() -> None:
    clock = Clock()
    registry, _, forgotten = make_registry(clock, ttl=600)
    registry.follow("llm", "vllm", SPEC)
    for _ in range(5):
        clock.now += 500
        registry.follow("llm", "vllm", SPEC)
        registry.evict_expired()
    assert forgotten == []


def test_cap_refuses_new_scaledobjects_naming_the_flag_and_keeps_followed_ones() -> None:
    clock = Clock()
    registry, _, _ = make_registry(clock, cap=2)
    registry.follow("a", "one", SPEC)
    registry.follow("a", "two", SPEC)
    with pytest.raises(TooManyScaledObjects, match="--max-scaledobjects"):
        registry.follow("a", "three", SPEC)
    registry.follow("a", "one", SPEC)  # already followed: still served
    clock.now += 601
    registry.follow("a", "three", SPEC)  # the others expired, so there is room again
    assert registry.followed_keys() == [("a", "three")]


def test_at_the_cap_one_no_longer_called_gives_way_to_a_new_one() -> None:
    # A flood of made-up names fills the cap; a minute later the first of them makes room for a real
    # ScaledObject, while the ones KEDA keeps calling (every pollingInterval) are never pushed out.
    clock = Clock()
    registry, tracker, forgotten = make_registry(clock, cap=3, ttl=600)
    registry.follow("real", "polled", SPEC)
    registry.follow("flood", "made-up-1", SPEC)
    registry.follow("flood", "made-up-2", SPEC)
    clock.now += 30
    registry.follow("real", "polled", SPEC)
    with pytest.raises(TooManyScaledObjects):
        registry.follow("real", "new", SPEC)  # nothing idle for a minute yet
    clock.now += 31
    registry.follow("real", "new", SPEC)
    assert forgotten == ["made-up-1"] and ("flood", "made-up-1") in tracker.forgotten
    assert registry.get("real", "polled") is not None


def test_a_namespace_below_its_share_takes_room_from_the_largest_even_when_all_are_polled() -> None:
    # One namespace fills the cap and polls each ScaledObject every 30 s: none is ever idle for a minute.
    clock = Clock()
    registry, _, forgotten = make_registry(clock, cap=6)
    for index in range(6):
        registry.follow("big", f"so-{index}", SPEC)
    clock.now += 30
    for index in range(6):
        registry.follow("big", f"so-{index}", SPEC)
    registry.follow("small", "first", SPEC)  # share 3: big's least recently called goes
    registry.follow("other", "first", SPEC)  # share 2: big again, the largest
    assert forgotten == ["so-0", "so-1"]
    registry.follow("small", "second", SPEC)  # small holds 1 of its 2
    assert forgotten == ["so-0", "so-1", "so-2"]
    assert [len(registry.in_namespace(ns)) for ns in ("big", "small", "other")] == [3, 2, 1]


def test_a_namespace_at_its_share_is_refused_naming_its_count_share_and_when_room_is_made() -> None:
    clock = Clock()
    registry, _, forgotten = make_registry(clock, cap=4, ttl=600)
    for name in ("a", "b", "c"):
        registry.follow("big", name, SPEC)
    registry.follow("small", "a", SPEC)
    registry.follow("small", "b", SPEC)  # share 2: big (3) gives one
    with pytest.raises(TooManyScaledObjects) as refused:
        registry.follow("small", "c", SPEC)
    assert str(refused.value) == (
        "namespace small follows 2 ScaledObjects, at or above its fair share of 2 (the --max-scaledobjects"
        " limit of 4 shared by 2 namespaces); room is made when a ScaledObject has not been called for 60s"
    )
    with pytest.raises(TooManyScaledObjects, match="namespace big follows 2 ScaledObjects"):
        registry.follow("big", "d", SPEC)
    # The time said is the one that applies: with a TTL under a minute, the TTL.
    short, _, _ = make_registry(clock, cap=1, ttl=20)
    short.follow("big", "a", SPEC)
    with pytest.raises(TooManyScaledObjects, match="not been called for 20s"):
        short.follow("big", "b", SPEC)
    assert forgotten == ["a"]


@pytest.mark.parametrize(
    ("namespace", "name"),
    [
        ("", "vllm"),
        ("llm", ""),
        ("LLM", "vllm"),
        ("llm", "Vllm"),
        ("a" * 64, "vllm"),
        ("llm", "a" * 254),
        ("llm", "vllm/../x"),
        ("llm ", "vllm"),
    ],
)
def test_names_that_kubernetes_would_refuse_are_invalid_and_keep_no_state(namespace: str, name: str) -> None:
    registry, _, _ = make_registry(Clock())
    with pytest.raises(ConfigError) as raised:
        registry.follow(namespace, name, SPEC)
    assert len(str(raised.value)) < 400  # the message quotes at most ~100 characters of the input
    assert len(registry) == 0


def test_longest_valid_names_are_accepted() -> None:
    registry, _, _ = make_registry(Clock())
    registry.follow("a" * 63, "b" * 253, SPEC)
    assert len(registry) == 1


class NewKindOfNoData(NoData):
    pass


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ConfigError("x"), grpc.StatusCode.INVALID_ARGUMENT),
        (NoData("x"), grpc.StatusCode.UNAVAILABLE),
        (NewKindOfNoData("x"), grpc.StatusCode.UNAVAILABLE),
        (TooManyStreams("x"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (TooManyScaledObjects("x"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (ResourceExhausted("x"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (RuntimeError("x"), grpc.StatusCode.INTERNAL),
    ],
)
def test_errors_map_along_the_class_hierarchy(error: Exception, code: grpc.StatusCode) -> None:
    assert status_for(error) is code


def registry_recording_drops(
    clock: Clock, ttl: float = 600.0
) -> tuple[Registry, RecordingTracker, list[str]]:
    tracker = RecordingTracker()
    dropped: list[str] = []
    registry = Registry(
        ttl=ttl,
        cap=100,
        clock=clock,
        tracker=tracker,
        on_drop=lambda followed, subscription: dropped.append(subscription.spec.metric_name),
    )
    return registry, tracker, dropped


def named(metric_name: str) -> TriggerSpec:
    return parse_trigger({"threshold": "70", "podNamePrefix": "vllm-", "metricName": metric_name})


def test_each_trigger_spec_is_its_own_subscription() -> None:
    registry, _, _ = registry_recording_drops(Clock())
    registry.follow("llm", "vllm", named("a"))
    entry = registry.follow("llm", "vllm", named("b"))
    assert list(entry.triggers) == [named("a"), named("b")]


def test_ever_new_trigger_metadata_on_one_scaledobject_keeps_a_bounded_number_of_subscriptions() -> None:
    clock = Clock()
    registry, _, dropped = registry_recording_drops(clock)
    for i in range(5_000):
        clock.now += 0.001
        entry = registry.follow("llm", "vllm", named(f"m{i}"))
    assert len(entry.triggers) == MAX_TRIGGERS_PER_SCALEDOBJECT
    assert len(dropped) == 5_000 - MAX_TRIGGERS_PER_SCALEDOBJECT
    assert dropped[:2] == ["m0", "m1"]  # the least recently called go first


def test_a_trigger_edited_away_is_dropped_once_discovery_reads_the_new_scaledobject() -> None:
    clock = Clock()
    registry, tracker, dropped = registry_recording_drops(clock)
    registry.follow("llm", "vllm", named("old"))
    clock.now += 30
    # KEDA now calls with the edited metadata; discovery has not re-read the ScaledObject yet.
    tracker.current = {named("old")}
    registry.follow("llm", "vllm", named("new"))
    clock.now += ROOM_AFTER_SECONDS
    registry.follow("llm", "vllm", named("new"))
    registry.prune()
    assert dropped == []  # the new one is called but not known current: nothing is dropped on a guess
    tracker.current = {named("new")}
    registry.prune()
    assert dropped == ["old"]
    (entry,) = [registry.get("llm", "vllm")]
    assert entry is not None and list(entry.triggers) == [named("new")]


def test_a_trigger_not_in_the_scaledobject_but_still_called_stays() -> None:
    clock = Clock()
    registry, tracker, dropped = registry_recording_drops(clock)
    tracker.current = {named("a")}
    for _ in range(3):
        registry.follow("llm", "vllm", named("a"))
        registry.follow("llm", "vllm", named("unmatched"))
        clock.now += ROOM_AFTER_SECONDS
        registry.prune()
    assert dropped == []


def test_without_kubernetes_an_idle_trigger_goes_after_the_ttl_and_a_called_one_stays() -> None:
    clock = Clock()
    registry = Registry(
        ttl=600,
        cap=100,
        clock=clock,
    )
    registry.follow("llm", "vllm", named("old"))
    for _ in range(7):
        clock.now += 100
        registry.follow("llm", "vllm", named("new"))
        registry.prune()
    entry = registry.get("llm", "vllm")
    assert entry is not None and list(entry.triggers) == [named("new")]


def test_an_idle_scaledobject_of_a_namespace_within_its_share_never_gives_way_to_another() -> None:
    """SPEC §2: a ScaledObject at zero is called only every pollingInterval (perhaps over a minute): a
    namespace above its share must not push out another namespace's only one for being idle."""
    now = [1000.0]
    forgotten: list[tuple[str, str]] = []
    registry = Registry(
        ttl=600.0, cap=4, clock=lambda: now[0], on_forget=lambda f: forgotten.append((f.namespace, f.name))
    )
    registry.follow("quiet", "wake-from-zero", SPEC)  # polled every 120 s
    for index in range(3):
        registry.follow("noisy", f"so-{index}", SPEC)
    now[0] += 61.0
    for index in range(3):
        registry.follow("noisy", f"so-{index}", SPEC)
    with pytest.raises(TooManyScaledObjects):
        registry.follow("noisy", "so-3", SPEC)  # 3 of 4 held, its share is 2
    assert forgotten == []
    now[0] += 61.0  # the noisy namespace's own idle ones still give way to it
    registry.follow("noisy", "so-4", SPEC)
    assert forgotten == [("noisy", "so-0")]
