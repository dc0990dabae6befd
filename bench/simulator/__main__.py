"""`python -m bench.simulator gpu|llm`: the autoscaling simulators from the command line.

gpu: the GPU-utilisation traces under the four GPU metrics (one line per trace and policy).
llm: an LLM-serving fleet under every policy; `--json` prints one object per (trace, policy). With
`--slo-attainment`, the SLO judge (llm_judge): each policy's knobs searched on the trace, one object per
policy at its cheapest setting meeting the SLO (else its best attainment), and the README's `recommended`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from bench.simulator.gpu import simulate_all
from bench.simulator.llm_fleet import ServerModel
from bench.simulator.llm_judge import JUDGE_ONLY, JUDGED, judge
from bench.simulator.llm_policies import DEMAND_WINDOW, POD_RATE, POLICY_NAMES, REQUESTS_TARGET
from bench.simulator.llm_run import Slo, run_matrix
from bench.simulator.llm_traces import (
    LlmTrace,
    TraceFileError,
    builtin_traces,
    held_out_traces,
    read_trace,
)
from keda_gpu_scaler.core.demand import MAX_WINDOW_SECONDS as MAX_WINDOW
from keda_gpu_scaler.core.demand import MIN_WINDOW_SECONDS as MIN_WINDOW

TWO_SPEED = 2.2  # `--two-speed`: every other pod this many times faster (issue #38's mixed pool)


def _gpu(args: argparse.Namespace) -> int:
    for trace, runs in simulate_all().items():
        for run in runs:
            print(
                f"{trace:8} {run.policy.label:40} under {run.under:8,.0f} GPU-s"
                f"  over {run.over:8,.0f} GPU-s  changes {run.changes:3}  most {max(run.replicas)}"
            )
    return 0


def _trace(path: Path, seed: int) -> LlmTrace:
    """A CSV file, or a built-in trace by name when no such file exists."""
    if not path.exists():
        for trace in builtin_traces(POD_RATE, seed) + held_out_traces(POD_RATE, seed):
            if trace.name == str(path):
                return trace
    return read_trace(path)


def _judge(args: argparse.Namespace, trace: LlmTrace, model: ServerModel) -> int:
    slo = Slo(args.slo_ttft, args.slo_tpot_ms / 1000)
    started = time.monotonic()
    policies = tuple(args.policy) if args.policy else JUDGED
    chosen, _ = judge(
        trace, args.seed, slo, args.slo_attainment, args.min_replicas, model, policies,
        start_scale=args.start_threshold_scale,
    )  # fmt: skip
    print(f"judged {trace.name} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    print(json.dumps(chosen, indent=1))
    return 0


def _llm(args: argparse.Namespace) -> int:
    try:
        traces = [_trace(args.trace, args.seed)] if args.trace else builtin_traces(POD_RATE, args.seed)
    except TraceFileError as error:
        print(f"python -m bench.simulator llm: {error}", file=sys.stderr)
        return 2
    speed = TWO_SPEED if args.two_speed else 1.0
    model = dataclasses.replace(ServerModel(), gateway_ttl=args.gateway_ttl, fast_pod_speed=speed)
    if args.slo_attainment is not None:
        return _judge(args, traces[0], model)
    policies = tuple(args.policy) if args.policy else POLICY_NAMES
    options = {} if args.window is None else {"window": args.window}
    runs = run_matrix(
        traces, policies, args.seed, args.min_replicas, model, requests_target=args.requests_target, **options
    )
    rows = [run.summary() for run in runs]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    for row in rows:
        print(
            f"{row['trace']:8} {row['policy']:24} GPU-s {row['gpu_seconds']:9,.0f}"
            f"  waiting req-s {row['waiting_request_seconds']:11,.0f}  p95 wait {row['p95_wait_seconds']:6.1f} s"
            f"  TTFT p95 {row['ttft_p95_seconds']:6.1f} s  {row['ms_per_output_token']:5.1f} ms/token"
            f"  dropped {row['dropped_requests']:5}  changes {row['scale_changes']:3}"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.simulator", description=__doc__)
    commands = parser.add_subparsers(dest="command")
    gpu = commands.add_parser("gpu", help="GPU-utilisation workloads under the four GPU metrics")
    gpu.set_defaults(handler=_gpu)
    llm = commands.add_parser("llm", help="an LLM-serving fleet under every policy")
    llm.add_argument("--json", action="store_true", help="print a JSON array, one object per (trace, policy)")
    llm.add_argument(
        "--trace",
        type=Path,
        help="CSV: seconds,requests_per_second[,prompt_tokens,output_tokens], or a built-in trace's name",
    )
    llm.add_argument(
        "--slo-attainment",
        type=float,
        metavar="SHARE",
        help="judge the trace: each policy's cheapest setting with at least this share of requests in the SLO",
    )
    llm.add_argument("--slo-ttft", type=float, default=2.0, metavar="SECONDS", help="TTFT target (default 2)")
    llm.add_argument(
        "--slo-tpot-ms",
        type=float,
        default=50.0,
        metavar="MS",
        help="mean time per output token target (default 50)",
    )
    llm.add_argument(
        "--min-replicas",
        type=int,
        metavar="N",
        help="minReplicaCount for every policy (default: 1, and 0 for the two wake-from-zero policies)",
    )
    llm.add_argument(
        "--gateway-ttl",
        type=float,
        default=ServerModel().gateway_ttl,
        metavar="SECONDS",
        help="how long the gateway holds a request while no pod is Ready (default: the EPP's 60)",
    )
    llm.add_argument(
        "--requests-target",
        type=float,
        metavar="N",
        help=f"target requests in flight per pod for the requests and pending triggers (default {REQUESTS_TARGET})",
    )
    llm.add_argument(
        "--window",
        type=float,
        metavar="SECONDS",
        help=f"the demand policies' window (default {DEMAND_WINDOW:g})",
    )
    llm.add_argument(
        "--policy",
        action="append",
        choices=POLICY_NAMES + JUDGE_ONLY,
        help=f"only this policy; repeatable ({' and '.join(JUDGE_ONLY)}: with --slo-attainment only)",
    )
    llm.add_argument(
        "--start-threshold-scale",
        type=float,
        default=1.0,
        metavar="F",
        help="recommended-auto's thresholdStart: F × the calibrated threshold (default 1)",
    )
    llm.add_argument(
        "--two-speed",
        action="store_true",
        help=f"a pool of two GPU speeds: every other pod serves {TWO_SPEED:g}× faster than the model's",
    )
    llm.add_argument("--seed", type=int, default=1, help="random seed of arrivals and tokens (default 1)")
    llm.set_defaults(handler=_llm)
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["gpu", *(argv or [])])
    if getattr(args, "min_replicas", None) is not None and args.min_replicas < 0:
        parser.error(f"--min-replicas {args.min_replicas}: must be ≥ 0")
    if getattr(args, "requests_target", None) is not None and not args.requests_target > 0:
        parser.error(f"--requests-target {args.requests_target:g}: must be > 0")
    if getattr(args, "window", None) is not None and not MIN_WINDOW <= args.window <= MAX_WINDOW:
        parser.error(f"--window {args.window:g}: must be between {MIN_WINDOW:g} and {MAX_WINDOW:g} seconds")
    if getattr(args, "slo_attainment", None) is not None and not 0 < args.slo_attainment <= 1:
        parser.error(f"--slo-attainment {args.slo_attainment:g}: must be > 0 and ≤ 1")
    if args.command == "llm" and not (args.slo_ttft > 0 and args.slo_tpot_ms > 0):
        parser.error(f"--slo-ttft {args.slo_ttft:g} and --slo-tpot-ms {args.slo_tpot_ms:g}: both must be > 0")
    if args.command == "llm" and not args.start_threshold_scale > 0:
        parser.error(f"--start-threshold-scale {args.start_threshold_scale:g}: must be > 0")
    judge_only = sorted(set(getattr(args, "policy", None) or ()) & set(JUDGE_ONLY))
    if judge_only and getattr(args, "slo_attainment", None) is None:
        parser.error(f"--policy {judge_only[0]}: judged only, give --slo-attainment")
    if getattr(args, "gateway_ttl", 1.0) <= 0:
        parser.error(f"--gateway-ttl {args.gateway_ttl:g}: must be > 0")
    handler = args.handler
    return int(handler(args))


if __name__ == "__main__":
    sys.exit(main())
