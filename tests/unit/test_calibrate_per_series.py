"""`calibrate` takes its rates as the server does, per series (SPEC §6): one data-parallel engine of the
calibrated pod restarting is not the pod restarting. Summed first, the other engine's whole history
arrived at once (5,017 requests/s read for a pod taking 10) and became the suggested threshold."""

from __future__ import annotations

import pytest

from keda_gpu_scaler import calibrate

PAST = 100_000  # what each engine counted before the ramp


def page(t: float) -> bytes:
    """Two vLLM engines, 5 requests/s each (10/s for the pod), 20 ms a token now after a slow past of
    100 ms; engine 1 restarts at 32 s and counts from 0 again, engine 0 never restarts."""
    lines = []
    for engine in ("0", "1"):
        restarted = engine == "1" and t >= 32
        finished = 5 * (t - 32) if restarted else PAST + 5 * t
        tokens = 100 * finished
        seconds = 0.02 * tokens if restarted else 0.1 * 100 * PAST + 0.02 * 100 * 5 * t
        labels = f'engine="{engine}",model_name="m"'
        lines += [
            f"vllm:num_requests_running{{{labels}}} 4",
            f"vllm:num_requests_waiting{{{labels}}} 0",
            f'vllm:request_success_total{{{labels},finished_reason="stop"}} {finished}',
            f"vllm:inter_token_latency_seconds_sum{{{labels}}} {seconds}",
            f"vllm:inter_token_latency_seconds_count{{{labels}}} {tokens}",
        ]
    return ("\n".join(lines) + "\n").encode()


def test_one_engine_restarting_reads_as_that_engine_only() -> None:
    calibration = calibrate.Calibration(window=20)
    steps = [calibration.observe(float(at), page(at)) for at in range(0, 65, 5)]
    assert all(isinstance(step, calibrate.Step) for step in steps), steps
    rates = [
        step.requests for step in steps if isinstance(step, calibrate.Step) and step.requests is not None
    ]
    # 10/s throughout (a little less where engine 1 lost the 4 requests it held).
    assert rates and all(8 <= rate <= 10.5 for rate in rates), rates
    per_token = [step.per_token for step in steps if isinstance(step, calibrate.Step) and step.per_token]
    assert per_token == pytest.approx([0.02] * len(per_token)), per_token
    assert calibration.best is not None and calibration.best.requests is not None
    assert calibration.best.requests <= 10.5


def test_the_time_per_token_is_the_calibrated_models_own() -> None:
    """A page serving two models: `--model` times its own tokens, not the other model's (80 ms) too."""

    def two_models(t: float) -> bytes:
        lines = []
        for model, per_token in (("m", 0.02), ("other", 0.08)):
            labels = f'engine="0",model_name="{model}"'
            lines += [
                f"vllm:num_requests_running{{{labels}}} 4",
                f"vllm:num_requests_waiting{{{labels}}} 0",
                f'vllm:request_success_total{{{labels},finished_reason="stop"}} {5 * t}',
                f"vllm:inter_token_latency_seconds_sum{{{labels}}} {per_token * 500 * t}",
                f"vllm:inter_token_latency_seconds_count{{{labels}}} {500 * t}",
            ]
        return ("\n".join(lines) + "\n").encode()

    calibration = calibrate.Calibration(window=20, model="m")
    steps = [calibration.observe(float(at), two_models(at)) for at in range(0, 30, 5)]
    per_token = [s.per_token for s in steps if isinstance(s, calibrate.Step) and s.per_token is not None]
    assert per_token and per_token == pytest.approx([0.02] * len(per_token)), per_token
