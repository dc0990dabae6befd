"""Admission of /explain requests: in-flight limit and cost budget, with a hand-driven clock."""

from __future__ import annotations

from keda_gpu_scaler.server.admission import Admission, explain_cost


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_requests_beyond_the_in_flight_limit_wait_for_one_to_end() -> None:
    gate = Admission(in_flight=2, units_per_second=100, burst=100, clock=Clock())
    assert gate.admit(1) is None and gate.admit(1) is None
    assert gate.admit(1) == 1.0
    gate.done()
    assert gate.admit(1) is None


def test_the_budget_refills_with_time_and_a_huge_answer_is_never_refused_for_good() -> None:
    clock = Clock()
    gate = Admission(in_flight=10, units_per_second=10, burst=20, clock=clock)
    assert gate.admit(1) is None and gate.charge(19) is None
    gate.done()
    wait = gate.admit(1)
    assert wait == 1.0
    clock.now += 0.1
    assert gate.admit(1) is None
    gate.done()
    # An answer costing more than the whole burst goes through on a full bucket, then the debt is paid.
    clock.now += 100
    assert gate.admit(1) is None and gate.charge(500) is None
    gate.done()
    assert gate.admit(1) is not None
    clock.now += 49
    assert gate.admit(1) is None


def test_cost_grows_with_the_pods_listed() -> None:
    assert explain_cost(0) == 0 and explain_cost(99) == 0 and explain_cost(6000) == 60
