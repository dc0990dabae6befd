"""The simulator's `threshold: auto` (issue #38): recommended-auto and recommended-tuned in the judge, the
simulated HPA following the target the product publishes (external-push), and the two-speed pool."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.simulator import llm_judge  # noqa: E402
from bench.simulator.__main__ import TWO_SPEED, main  # noqa: E402
from bench.simulator.llm_fleet import Fleet, ServerModel  # noqa: E402
from bench.simulator.llm_judge import AUTO, TUNED  # noqa: E402
from bench.simulator.llm_policies import DemandTrigger, ScalerTrigger, demand_tokens_threshold  # noqa: E402
from bench.simulator.llm_product import NAMESPACE, SCALED_OBJECT  # noqa: E402
from bench.simulator.llm_run import Realism, Slo  # noqa: E402
from bench.simulator.llm_signals import Page, Signals, Timing, View  # noqa: E402
from bench.simulator.llm_traces import LlmTrace, Segment  # noqa: E402


def configured(policy: str, scale: float | None) -> tuple[DemandTrigger, ScalerTrigger]:
    trace = LlmTrace("t", "", (Segment(0, 1.0),), 60.0)
    job = llm_judge.Job(trace, policy, scale, None, 1, None, ServerModel(), Slo(), Realism())
    demand, guard, _ = llm_judge.configured(job).triggers  # and the wake, `pending`
    assert isinstance(demand, DemandTrigger) and isinstance(guard, ScalerTrigger)
    return demand, guard


def test_recommended_auto_is_recommended_with_threshold_auto_from_f_times_the_calibrated_threshold() -> None:
    plain, plain_guard = configured("recommended", None)
    auto, guard = configured(AUTO, 0.6)
    calibrated = demand_tokens_threshold()  # recommended itself sizes at the README's threshold
    assert auto.metadata["threshold"] == "auto"
    assert float(auto.metadata["thresholdStart"]) == pytest.approx(0.6 * calibrated)
    assert auto.threshold == pytest.approx(0.6 * calibrated)  # the HPA's first target
    rest = {k: v for k, v in auto.metadata.items() if k not in ("threshold", "thresholdStart")}
    assert rest == {k: v for k, v in plain.metadata.items() if k != "threshold"}
    assert guard.metadata == plain_guard.metadata


def test_recommended_tuned_scales_only_the_demand_threshold() -> None:
    tuned, guard = configured(TUNED, 1.4)
    calibrated = demand_tokens_threshold()
    assert float(tuned.metadata["threshold"]) == pytest.approx(1.4 * calibrated) == tuned.threshold
    assert guard.threshold == llm_judge.README_GUARD


def test_the_hpa_of_an_auto_trigger_holds_the_target_the_product_publishes() -> None:
    pages = {"vllm-0": Page(4, 0, 0.1)}
    signals = Signals(Timing())
    signals.direct = View(0.0, pages, tuple(pages))
    signals.scrapes.append(signals.direct)
    signals.ready = tuple(pages)
    trigger, _ = configured(AUTO, 1.0)
    start = trigger.threshold
    trigger.value(signals)
    assert (trigger.threshold, trigger.target_changes) == (start, [])
    followed = signals.cluster.scaler.app.registry.get(NAMESPACE, SCALED_OBJECT)
    assert followed is not None
    (spec,) = followed.triggers
    assert followed.spec_streams[spec] == 1  # no "no StreamMetricSpec stream" warning
    followed.targets.set(spec, 1.5 * start)  # what the learner does when it moves the target
    signals.now = 30.0
    trigger.value(signals)
    assert trigger.threshold == 1.5 * start
    assert trigger.target_changes == [(30.0, 1.5 * start)]


def test_the_two_speed_pool_makes_every_other_pod_faster_and_the_default_pool_is_unchanged() -> None:
    model = ServerModel(fast_pod_speed=TWO_SPEED)
    fleet = Fleet(model, 4, 0.0)
    fast = [pod.model.itl(100) < model.itl(100) for pod in fleet.pods]
    assert fast == [False, True, False, True]
    quick = fleet.pods[1].model
    assert quick.itl(100) == pytest.approx(model.itl(100) / TWO_SPEED)
    assert quick.prefill_tokens_per_second == pytest.approx(TWO_SPEED * model.prefill_tokens_per_second)
    assert quick.kv_capacity_tokens == model.kv_capacity_tokens
    assert all(pod.model == ServerModel() for pod in Fleet(ServerModel(), 3, 0.0).pods)


def test_the_judge_runs_recommended_auto_from_the_start_scale_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "short.csv"
    trace.write_text("seconds,requests_per_second\n0,10\n300,20\n")
    argv = ["llm", "--trace", str(trace), "--policy", AUTO, "--slo-attainment", "0.9", "--two-speed"]
    assert main([*argv, "--start-threshold-scale", "1.6"]) == 0
    auto, recommended = json.loads(capsys.readouterr().out)
    assert (auto["policy"], recommended["policy"]) == (AUTO, "recommended")
    assert auto["threshold_start"] == pytest.approx(1.6 * demand_tokens_threshold())
    assert auto["setting"]["threshold_scale"] == 1.6
    assert {"learned_target", "target_changes", "target_changes_per_hour"} <= auto.keys()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--slo-attainment", "0.9", "--start-threshold-scale", "0"],
            "--start-threshold-scale 0: must be > 0",
        ),
        (["--policy", AUTO], f"--policy {AUTO}: judged only, give --slo-attainment"),
        (["--policy", TUNED], f"--policy {TUNED}: judged only, give --slo-attainment"),
    ],
)
def test_bad_auto_options_are_refused_naming_them(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(["llm", *argv])
    assert message in capsys.readouterr().err
