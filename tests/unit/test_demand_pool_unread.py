"""`demand` with `inferencePool` while an endpoint-picker replica cannot be read (SPEC §6, §7): the held
requests read are a lower bound, and activity is decided in the trigger's unit (a rate), never by the
held count against activationThreshold (a count against a rate made up a `false`, or withheld a wake)."""

from __future__ import annotations

from keda_gpu_scaler.core.decide import decide
from keda_gpu_scaler.core.pending import ReplicaInput
from keda_gpu_scaler.core.snapshot import PoolSnapshot, Snapshot, SourceKind, Targets
from keda_gpu_scaler.core.trigger_parse import parse_trigger
from keda_gpu_scaler.demo.epp import Queued, epp_page
from keda_gpu_scaler.pages.gateways import page_queue

TRIGGER = {"metric": "demand", "window": "30", "inferencePool": "chat-pool", "podSelector": "app=x"}


def at_zero(held: int, tokens_per_request: float | None = None) -> Snapshot:
    """No pod (scaled to zero); epp-0 holds `held` requests, epp-1 cannot be read."""
    table = page_queue(epp_page("chat-pool", {Queued("m"): held}))
    pool = PoolSnapshot(
        (ReplicaInput("epp-0", table), ReplicaInput("epp-1", None, "connection refused")),
        "no replica",
        growth={"epp-0": 0.0},
        tokens_per_request=tokens_per_request,
    )
    return Snapshot("llm", 0.0, SourceKind.INFERENCE, Targets(frozenset(), replicas=0), None, pool=pool)


def test_a_lower_bound_below_the_activation_rate_is_no_false() -> None:
    # 10 held over a 30 s window add 0.33/s, under activationThreshold 2/s; epp-1 may hold 60 more. The
    # count 10 > 2 read as "activity known", and IsActive answered false.
    spec = parse_trigger({**TRIGGER, "threshold": "5", "activationThreshold": "2"})
    decision = decide(spec, at_zero(10))
    assert decision.error is None and decision.evaluation is not None, decision.error
    assert not decision.evaluation.active and decision.evaluation.activity_unknown is not None
    assert "epp-1 cannot be read" in decision.evaluation.activity_unknown
    assert any("lower bound" in note for note in decision.notes), decision.notes


def test_a_lower_bound_above_the_activation_rate_wakes_whatever_the_unread_replica_holds() -> None:
    # 15 held of 500 tokens over 30 s: 250 tokens/s, over activationThreshold 20 tokens/s. The count
    # 15 <= 20 read as "activity unknown": UNAVAILABLE where the workload should wake.
    spec = parse_trigger(
        {**TRIGGER, "demandUnit": "tokens", "threshold": "1000", "activationThreshold": "20"}
    )
    decision = decide(spec, at_zero(15, tokens_per_request=500.0))
    assert decision.error is None and decision.evaluation is not None, decision.error
    assert decision.evaluation.active and decision.evaluation.value == 250.0


def test_nothing_held_at_the_readable_replica_is_unknown_not_idle() -> None:
    spec = parse_trigger({**TRIGGER, "threshold": "5"})
    decision = decide(spec, at_zero(0))
    assert decision.evaluation is None and decision.error is not None
    assert "cannot be read" in str(decision.error)
