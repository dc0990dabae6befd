"""The LLM-serving simulator's invariants: requests are conserved, no pod means no GPU-seconds, its HPA uses
the product's formula, runs repeat with a seed, and a bad trace file is refused with one clear line."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.simulator.__main__ import main  # noqa: E402
from bench.simulator.llm_fleet import Fleet, ServerModel  # noqa: E402
from bench.simulator.llm_policies import POD_RATE, make_policy  # noqa: E402
from bench.simulator.llm_run import simulate_llm  # noqa: E402
from bench.simulator.llm_signals import Page, Signals, Timing, View  # noqa: E402
from bench.simulator.llm_traces import (  # noqa: E402
    LlmTrace,
    Segment,
    TraceFileError,
    draw_arrivals,
    read_trace,
)
from keda_gpu_scaler.scaling import hpa_desired_replicas  # noqa: E402

# Quiet 5 min, a burst of 4 pods' worth for 2 min, quiet again: wakes from zero and overloads on the way.
WAKE = LlmTrace("wake", "", (Segment(0, 0.0), Segment(300, 4 * POD_RATE), Segment(420, 0.0)), 1200.0)


def run(trace: LlmTrace, policy: str, ttl: float = 60.0, seed: int = 3):  # type: ignore[no-untyped-def]
    model = dataclasses.replace(ServerModel(), gateway_ttl=ttl)
    return simulate_llm(trace, draw_arrivals(trace, seed), make_policy(policy), POD_RATE, model)


@pytest.mark.parametrize("policy", ["requests+pending", "requests+prometheus-wake", "requests"])
def test_every_request_is_served_dropped_or_still_in_the_system(policy: str) -> None:
    result = run(WAKE, policy, ttl=30.0)  # a TTL shorter than the cold start: the wake drops some
    assert result.arrived > 1000
    assert result.arrived == result.completed + result.dropped + result.in_system
    if policy != "requests":
        assert result.dropped > 0


def test_no_gpu_seconds_while_scaled_to_zero() -> None:
    quiet = LlmTrace("quiet", "", (Segment(0, 0.0),), 1200.0)
    result = run(quiet, "requests+pending")
    assert result.arrived == 0
    assert result.gpu_seconds == 0
    assert max(result.replicas) == 0
    assert Fleet(ServerModel(), 0, 0.0).gpus() == 0


def test_scaled_to_zero_after_the_cooldown_once_requests_stop() -> None:
    result = run(WAKE, "requests+pending", ttl=120.0)
    assert result.dropped == 0  # the cold start (75 s) fits in the TTL
    assert result.replicas[-1] == 0
    # Idle once the backlog is served: the pods stay for KEDA's 300 s cooldown (and a poll), no longer.
    assert 0 < result.quiet_gpu_seconds <= (300 + 30) * max(result.replicas)


def signals_with(pages: dict[str, Page], starting: tuple[str, ...] = ()) -> Signals:
    signals = Signals(Timing())
    signals.direct = View(0.0, pages, tuple(pages) + starting, 0, {})
    return signals


@pytest.mark.parametrize(
    ("in_flight", "current"),
    [((90, 90, 90, 90), 4), ((50, 52, 55), 3), ((10, 10), 2), ((400,), 1), ((0, 0, 0), 3)],
)
def test_the_hpa_step_is_the_products_formula_on_the_sum(in_flight: tuple[int, ...], current: int) -> None:
    pages = {f"vllm-{i}": Page(n, 0, 0.1) for i, n in enumerate(in_flight)}
    policy = make_policy("requests")
    target = policy.triggers[0].threshold
    expected = hpa_desired_replicas(float(sum(in_flight)), target, current, average_value=True)
    assert policy.desired(signals_with(pages), current) == expected


def test_four_pods_at_90_in_flight_with_target_50_ask_for_8() -> None:
    pages = {f"vllm-{i}": Page(80, 10, 0.3) for i in range(4)}
    assert make_policy("requests").desired(signals_with(pages), 4) == 8
    # requests+kv_cache: the larger of ceil(360 / 50) and ceil(4 × 30 % / 70 %).
    assert make_policy("requests+kv_cache").desired(signals_with(pages), 4) == 8


def test_a_starting_pod_counts_as_the_scaler_counts_a_missing_pod() -> None:
    pages = {"vllm-0": Page(20, 0, 0.1), "vllm-1": Page(20, 0, 0.1)}
    # The ready pods alone ask for 1 of 3: the starting pod counts as the target, 20 + 20 + 50 → 2.
    assert make_policy("requests").desired(signals_with(pages, ("vllm-2",)), 3) == 2
    # Prometheus has no series for it at all: 40 → 1.
    prometheus = signals_with(pages, ("vllm-2",))
    prometheus.prometheus = prometheus.direct
    assert make_policy("prometheus-requests").desired(prometheus, 3) == 1


def test_the_same_seed_gives_the_same_run_and_another_seed_another() -> None:
    first, again, other = (
        run(WAKE, "requests", seed=5),
        run(WAKE, "requests", seed=5),
        run(WAKE, "requests", seed=6),
    )
    assert first.summary() == again.summary()
    assert first.summary() != other.summary()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("time,rate\n0,1\n", "row 1: header 'time,rate' is not allowed; use seconds,requests_per_second"),
        ("", "row 1: the file is empty"),
        ("seconds,requests_per_second\n", "row 2: no rows after the header"),
        (
            "seconds,requests_per_second\n0,1\n60,-2\n",
            "row 3: requests_per_second '-2' must be a finite number ≥ 0",
        ),
        ("seconds,requests_per_second\n0,1\n60,lots\n", "row 3: requests_per_second 'lots' is not a number"),
        (
            "seconds,requests_per_second\n0,1\n60,2\n30,1\n",
            "row 4: seconds 30 must be greater than the row before (60)",
        ),
    ],
)
def test_a_bad_trace_file_is_one_line_naming_the_row_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    with pytest.raises(TraceFileError, match="^" + str(path)):
        read_trace(path)
    assert main(["llm", "--json", "--trace", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1


def test_a_trace_file_with_token_means_is_read_piecewise_constant(tmp_path: Path) -> None:
    path = tmp_path / "night.csv"
    path.write_text("seconds,requests_per_second,prompt_tokens,output_tokens\n0,2,500,50\n60,0,500,50\n")
    trace = read_trace(path)
    assert (trace.rate_at(30), trace.rate_at(90), trace.duration) == (2.0, 0.0, 120.0)
    arrivals = draw_arrivals(trace, 1)
    assert all(t < 60 for t in arrivals.times)
    assert 300 < sum(arrivals.prompts) / len(arrivals.prompts) < 700


def test_the_json_has_one_object_per_trace_and_policy_with_the_named_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "short.csv"
    path.write_text("seconds,requests_per_second\n0,5\n120,0\n")
    args = ["llm", "--json", "--trace", str(path), "--policy", "requests", "--policy", "requests+pending"]
    assert main([*args, "--min-replicas", "1"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["trace"], r["policy"], r["min_replicas"]) for r in rows] == [
        ("short", "requests", 1),
        ("short", "requests+pending", 1),
    ]
    for field in (
        "gpu_seconds",
        "waiting_request_seconds",
        "p95_wait_seconds",
        "dropped_requests",
        "scale_changes",
    ):
        assert all(isinstance(r[field], int | float) for r in rows)


def test_the_gpu_simulator_still_runs_from_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gpu"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5 * 4  # five traces, four GPU metrics
    assert lines[0].startswith("step     (a) keda-gpu-scaler")
