"""The endpoint picker's signals beside its queue: flow control told on from off in both generations, series
told apart by their whole label set, requests turned away for want of an endpoint as a wake, saturation
never as load, and a `pending` trigger's `model` that matches nothing."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from keda_gpu_scaler.collect.gateway_source import gateway_reader
from keda_gpu_scaler.collect.scrape import read_page
from keda_gpu_scaler.core.errors import ConfigError, NoData
from keda_gpu_scaler.core.pending import ReplicaInput, pending_evaluation
from keda_gpu_scaler.core.trigger_parse import parse_trigger
from keda_gpu_scaler.demo.epp import Queued, epp_page
from keda_gpu_scaler.pages.exposition import Sample
from keda_gpu_scaler.pages.gateways import (
    NotAGatewayPage,
    PoolQueue,
    QueueTable,
    epp,
    page_queue,
    read_queue,
    since,
    table_from_samples,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "gateways"
BEFORE = (FIXTURES / "llm_d_epp_no_endpoints_before.prom").read_text()
AFTER = (FIXTURES / "llm_d_epp_no_endpoints_after.prom").read_text()
PENDING = {"metric": "pending", "threshold": "4", "inferencePool": "chat-pool"}


def fixture(name: str) -> QueueTable:
    return page_queue((FIXTURES / name).read_bytes())


def queue(table: QueueTable, model: str | None = None) -> PoolQueue:
    reading = read_queue(table, "chat-pool", "llm", model)
    assert isinstance(reading, PoolQueue), reading
    return reading


def pages(*texts: str, replica: str = "epp-0") -> list[QueueTable]:
    """Pages of one replica read one after the other as the scrape path reads them."""
    reader = gateway_reader("llm", "chat-pool", replica)
    return [read_page(text.encode(), reader)["llm"][0].table for text in texts]  # type: ignore[attr-defined]


def evaluate(*tables: QueueTable, **metadata: str):  # type: ignore[no-untyped-def]
    spec = parse_trigger({**PENDING, **metadata})
    replicas = [ReplicaInput(f"epp-{i}", table) for i, table in enumerate(tables)]
    return pending_evaluation(replicas, spec, "llm", "no replica")


# -- flow control on or off, in both generations ----------------------------------------------------------


def test_an_idle_older_epp_with_flow_control_on_reads_0_not_flow_control_off() -> None:
    table = fixture("gie_epp_flow_control_idle.prom")
    assert table.flow_control and queue(table).total == 0


@pytest.mark.parametrize("prefix", ["llm_d_epp", "inference_extension"])
def test_either_generations_dispatch_cycle_tells_flow_control_on(prefix: str) -> None:
    page = f"inference_pool_ready_pods 0\n{prefix}_flow_control_dispatch_cycle_duration_seconds_count 12\n"
    assert queue(page_queue(page)).total == 0


# -- series are their whole label set ----------------------------------------------------------------------


def test_series_that_differ_only_by_a_label_the_reader_does_not_know_are_summed() -> None:
    assert queue(fixture("llm_d_epp_sharded.prom")).total == 8


def test_the_same_series_with_an_unknown_label_printed_twice_counts_once_or_is_refused() -> None:
    line = (FIXTURES / "llm_d_epp_sharded.prom").read_text().splitlines()[-1] + "\n"
    head = "llm_d_epp_ready_endpoints 0\n"
    assert queue(page_queue(head + line + line)).total == 4
    with pytest.raises(NotAGatewayPage, match="printed again with another value"):
        page_queue(head + line + line.replace("} 4", "} 5"))  # the parser names both lines


def test_prometheus_series_are_told_apart_by_their_whole_label_set() -> None:
    labels = {
        "inference_pool": "chat-pool",
        "target_model_name": "llama",
        "fairness_id": "a",
        "priority": "0",
    }
    samples = [Sample(epp.QUEUE, {**labels, "shard": shard}, 4.0, None) for shard in ("0", "1")]
    assert queue(table_from_samples(samples)).total == 8
    with pytest.raises(NotAGatewayPage, match="printed twice"):
        table_from_samples([samples[0], samples[0]._replace(value=5.0)])


# -- requests turned away for want of an endpoint -------------------------------------------------------------


def test_requests_turned_away_since_the_previous_page_are_a_wake() -> None:
    first, second = pages(BEFORE, AFTER)
    assert queue(first).turned_away == 0  # a first page only sets the baseline
    reading = queue(second)
    assert (reading.total, reading.turned_away) == (0, 5)  # RejectedCapacity and Dispatched are not counted
    result = evaluate(second)
    assert result.evaluation.value == 0 and result.evaluation.active
    assert any("turned 5 requests away" in note for note in result.notes)
    assert not evaluate(first).evaluation.active


def test_the_older_spelling_of_the_counter_is_read_too() -> None:
    old = [
        text.replace("llm_d_epp_flow_control_", "inference_extension_flow_control_")
        for text in (BEFORE, AFTER)
    ]
    assert queue(pages(*old)[1]).turned_away == 5


def test_a_page_with_both_spellings_counts_the_current_one() -> None:
    both = [
        text + text.replace("llm_d_epp_flow_control_", "inference_extension_flow_control_")
        for text in (BEFORE, AFTER)
    ]
    assert queue(pages(*both)[1]).turned_away == 5


def test_the_same_counters_again_are_no_wake() -> None:
    assert queue(pages(BEFORE, AFTER, AFTER)[2]).turned_away == 0


def test_a_counter_that_goes_down_is_an_epp_restart_not_a_wake() -> None:
    restarted = AFTER.replace('priority="0"} 5', 'priority="0"} 1')
    tables = pages(BEFORE, AFTER, restarted, AFTER)
    assert queue(tables[2]).turned_away == 0
    assert not evaluate(tables[2]).evaluation.active
    assert queue(tables[3]).turned_away == 4  # the restarted page is the new baseline
    gone = "\n".join(line for line in AFTER.splitlines() if "RejectedNoEndpoints" not in line) + "\n"
    assert queue(pages(AFTER, gone)[1]).turned_away == 0


def test_growth_is_per_replica_page_and_a_lost_page_leaves_a_lower_bound_that_is_active() -> None:
    (second,) = pages(BEFORE, AFTER)[1:]
    spec = parse_trigger(PENDING)
    replicas = [ReplicaInput("epp-0", second), ReplicaInput("epp-1", None, "timed out after 3s")]
    result = pending_evaluation(replicas, spec, "llm", "no replica")
    assert result.evaluation.active and result.evaluation.missing_pods == ("epp-1",)
    with pytest.raises(NoData):
        pending_evaluation([ReplicaInput("epp-0", pages(BEFORE)[0]), replicas[1]], spec, "llm", "no replica")


def test_a_wake_beside_an_unread_replica_is_active_and_a_lower_bound_of_0_is_no_value() -> None:
    """SPEC §7: the sum over the fresh replicas is the value only when above 0; requests turned away make
    the pool active all the same."""
    (turned_away,) = pages(BEFORE, AFTER)[1:]
    spec = parse_trigger(PENDING)
    lost = ReplicaInput("epp-1", None, "HTTP 500 Internal Server Error")
    result = pending_evaluation([ReplicaInput("epp-0", turned_away), lost], spec, "llm", "no replica")
    evaluation = result.evaluation
    assert evaluation.active and evaluation.activity_unknown is None
    assert evaluation.value_unknown is not None and "epp-1: HTTP 500" in evaluation.value_unknown
    assert "hold no request" in evaluation.value_unknown
    assert not any(note.startswith("value is a lower bound") for note in result.notes), result.notes
    # Every replica read: 0 is the value.
    assert evaluate(turned_away).evaluation.value_unknown is None
    # Requests held beside the wake: their sum is the lower bound.
    held = pages(
        BEFORE,
        AFTER.replace("# TYPE llm_d_epp_ready_endpoints", _QUEUED + "# TYPE llm_d_epp_ready_endpoints"),
    )[1]
    result = pending_evaluation([ReplicaInput("epp-0", held), lost], spec, "llm", "no replica")
    assert result.evaluation.value == 2 and result.evaluation.value_unknown is None
    assert any("lower bound" in note for note in result.notes), result.notes


def test_a_lower_bound_above_0_is_the_value_even_at_or_below_the_activation_threshold() -> None:
    """SPEC §7: with a replica unread, the fresh replicas' sum is GetMetrics' answer when above 0; at or
    below activationThreshold whether the pool is idle cannot be told (IsActive UNAVAILABLE, never false)."""
    held = pages(
        AFTER.replace("# TYPE llm_d_epp_ready_endpoints", _QUEUED + "# TYPE llm_d_epp_ready_endpoints")
    )[0]
    spec = parse_trigger({**PENDING, "activationThreshold": "5"})
    lost = ReplicaInput("epp-1", None, "timed out after 3s")
    result = pending_evaluation([ReplicaInput("epp-0", held), lost], spec, "llm", "no replica")
    evaluation = result.evaluation
    assert evaluation.value == 2 and evaluation.value_unknown is None
    assert (
        evaluation.activity_unknown is not None
        and "not above activationThreshold 5" in evaluation.activity_unknown
    )
    assert "epp-1: timed out after 3s" in evaluation.activity_unknown
    assert any(note.startswith("value is a lower bound") for note in result.notes), result.notes
    # Above the activation threshold: active, as read.
    result = pending_evaluation(
        [ReplicaInput("epp-0", held), lost], parse_trigger(PENDING), "llm", "no replica"
    )
    assert result.evaluation.active and result.evaluation.activity_unknown is None
    # A lower bound of 0 and no wake: neither the value nor activity can be told.
    with pytest.raises(NoData, match="not above activationThreshold"):
        pending_evaluation([ReplicaInput("epp-0", pages(BEFORE)[0]), lost], spec, "llm", "no replica")


_QUEUED = (
    "# TYPE llm_d_epp_flow_control_queue_size gauge\n"
    'llm_d_epp_flow_control_queue_size{fairness_id="d",inference_pool="chat-pool",model_name="m",priority="0",'
    'target_model_name="m"} 2\n'
)


def test_since_keeps_a_page_without_growth_as_it_is() -> None:
    table = fixture("llm_d_epp_no_endpoints_before.prom")
    assert since(table, table) is table


# -- saturation ------------------------------------------------------------------------------------------------


def test_an_empty_pools_saturation_is_shown_per_stage_and_never_load() -> None:
    table = fixture("llm_d_epp_no_endpoints_before.prom")
    reading = queue(table)
    assert reading.saturation == (("decode", 1.0), ("effective", 1.0), ("prefill", 1.0))
    evaluation = evaluate(table).evaluation
    assert evaluation.value == 0 and not evaluation.active
    (row,) = evaluation.pods
    assert row.inputs == () and ("saturation", "effective", 1.0) in [
        (g.gpu, g.host, g.value) for g in row.gpus
    ]


# -- a `model` that matches nothing ----------------------------------------------------------------------------

QWEN_PAGE = page_queue(epp_page("chat-pool", {Queued("Qwen/Qwen3-8B"): 3, Queued("llama"): 0}))


@pytest.mark.parametrize("model", ["qwen/qwen3-8b", "QWEN/Qwen3-8B", "Qwen/Qwen3 -8B"])
def test_a_model_differing_from_a_shown_one_by_case_or_blanks_is_an_error_naming_it(model: str) -> None:
    with pytest.raises(ConfigError, match=r"shows model 'Qwen/Qwen3-8B'.*set `model: Qwen/Qwen3-8B`"):
        evaluate(QWEN_PAGE, model=model)


def test_a_model_never_shown_reads_0_with_a_note_naming_the_models_shown_to_log_once() -> None:
    result = evaluate(QWEN_PAGE, model="mistral")
    assert result.evaluation.value == 0 and not result.evaluation.active
    (note,) = result.notes
    assert "'mistral' is not among the models" in note and "'Qwen/Qwen3-8B', 'llama'" in note
    (logged,) = result.to_log
    assert "'mistral' is not among the models InferencePool llm/chat-pool has shown" in logged
    # The logged line stays the same as the pool shows other models: logged once per ScaledObject.
    other = page_queue(epp_page("chat-pool", {Queued("Qwen/Qwen3-8B"): 3, Queued("gemma"): 1}))
    assert evaluate(other, model="mistral").to_log == (logged,)


def test_a_model_shown_or_no_model_or_nothing_shown_has_no_note() -> None:
    assert evaluate(QWEN_PAGE, model="Qwen/Qwen3-8B").notes == ()
    assert evaluate(QWEN_PAGE).notes == ()
    idle = fixture("llm_d_epp_flow_control_idle.prom")
    assert evaluate(idle, model="mistral").notes == ()


def test_the_never_shown_note_is_logged_once_per_scaledobject(caplog: pytest.LogCaptureFixture) -> None:
    from keda_gpu_scaler.server.registry import Followed
    from keda_gpu_scaler.server.spec_targets import CurrentTargets

    followed = Followed("llm", "chat", 0.0, CurrentTargets(lambda: 0.0))
    note = evaluate(QWEN_PAGE, model="mistral").to_log[0]
    with caplog.at_level(logging.INFO):
        assert followed.log_once(note, logging.INFO) and not followed.log_once(note, logging.INFO)
    assert sum("mistral" in record.message for record in caplog.records) == 1


def test_demand_at_zero_wakes_on_requests_turned_away_beside_an_unread_replica() -> None:
    """`demand` with `inferencePool` reads the pool as `pending` does: requests turned away are a wake
    (SPEC §7) whatever another replica holds. It was UNAVAILABLE, and a workload at zero stayed there
    while `pending` on the same replicas woke it."""
    from keda_gpu_scaler.core.decide import decide
    from keda_gpu_scaler.core.snapshot import PoolSnapshot, Snapshot, SourceKind, Targets

    (turned_away,) = pages(BEFORE, AFTER)[1:]
    lost = ReplicaInput("epp-1", None, "HTTP 500 Internal Server Error")
    spec = parse_trigger(
        {"metric": "demand", "threshold": "5", "inferencePool": "chat-pool", "podSelector": "a=b"}
    )
    pool = PoolSnapshot((ReplicaInput("epp-0", turned_away), lost), "no replica", growth={"epp-0": 0.0})
    decision = decide(
        spec, Snapshot("llm", 0.0, SourceKind.INFERENCE, Targets(frozenset(), replicas=0), None, pool=pool)
    )
    assert decision.evaluation is not None and decision.evaluation.active, decision.error
    assert decision.evaluation.activity_unknown is None  # IsActive: true
    assert "epp-1" in (decision.evaluation.value_unknown or "")  # GetMetrics: a lower bound of 0, no value
    # /explain and the explain command say so: no value, no replica count (they showed 0 and its HPA).
    from keda_gpu_scaler.explain import render_table
    from keda_gpu_scaler.server.http_endpoints import evaluation_json

    shown = evaluation_json(decision.evaluation, spec)
    assert shown["value"] is None and shown["hpa"] is None and shown["active"] is True
    assert "value unknown: a lower bound of 0" in render_table(
        {"namespace": "llm", "scaledObject": "chat", **shown}
    )


def test_demand_at_zero_wakes_on_requests_turned_away_as_pending_does() -> None:
    """Every replica read, none holding a request, one turning requests away: `pending` wakes (SPEC §7),
    and so does `demand` reading the same pool (its pending part counts toward activity)."""
    from keda_gpu_scaler.core.decide import decide
    from keda_gpu_scaler.core.snapshot import PoolSnapshot, Snapshot, SourceKind, Targets

    (turned_away,) = pages(BEFORE, AFTER)[1:]
    spec = parse_trigger(
        {"metric": "demand", "threshold": "5", "inferencePool": "chat-pool", "podSelector": "a=b"}
    )
    pool = PoolSnapshot((ReplicaInput("epp-0", turned_away),), "no replica", growth={"epp-0": 0.0})
    decision = decide(
        spec, Snapshot("llm", 0.0, SourceKind.INFERENCE, Targets(frozenset(), replicas=0), None, pool=pool)
    )
    assert decision.evaluation is not None and decision.evaluation.active, decision
    assert evaluate(turned_away).evaluation.active  # what `pending` answers on the same page
