"""Decision quality: the simulator's traces under the four policies, as tables and PNG plots in docs/."""

from __future__ import annotations

from pathlib import Path

from bench.harness import ROOT, Section
from bench.simulator import TRACES, Behavior, Run, Timing, simulate_all

DOCS = ROOT / "docs"


def plot(trace_name: str, runs: list[Run], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display here
    import matplotlib.pyplot as plt

    minutes = [t / 60 for t in runs[0].times]
    fig, ax = plt.subplots(figsize=(10, 4.8), dpi=100)
    ax.fill_between(
        minutes, runs[0].demand, step="post", alpha=0.15, color="black", label="demand (pods' worth)"
    )
    ax.step(
        minutes, runs[0].ideal, where="post", color="black", linestyle=":", label="replicas needed at 70 %"
    )
    colours = ("tab:green", "tab:orange", "tab:red", "tab:purple")
    for run, colour in zip(runs, colours, strict=True):
        ax.step(minutes, run.replicas, where="post", color=colour, linewidth=1.6, label=run.policy.label)
    ax.set_xlabel("minutes")
    ax.set_ylabel("pods (4 GPUs each)")
    ax.set_title(f"{trace_name}: replicas chosen by the HPA under each metric")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), fontsize=8, ncol=3, frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _settle(run: Run) -> str:
    if run.trace.settle_from is None:
        return "–"
    if run.settle is None:
        return "never (still changing)"
    ideal = run.ideal[int(run.trace.settle_from)]
    return f"{run.settle:.0f} s, holds {run.settled_at} (needed {ideal})"


def run(quick: bool = False) -> Section:
    timing = Timing()
    results = simulate_all(timing)
    DOCS.mkdir(exist_ok=True)
    parts = []
    for trace in TRACES:
        runs = results[trace.name]
        image = DOCS / f"sim-{trace.name}.png"
        plot(trace.name, runs, image)
        rows = "\n".join(
            f"| {r.policy.label} | {r.under:,.0f} | {r.over:,.0f} | {r.changes} | {max(r.replicas)} | {_settle(r)} |"
            for r in runs
        )
        parts.append(
            f"""### {trace.name}: {trace.description}

| policy | GPU-s under-provisioned | GPU-s over-provisioned | replica changes | most replicas | time to steady state |
|---|---|---|---|---|---|
{rows}

![{trace.name}](sim-{trace.name}.png)
"""
        )
    b = Behavior()
    step = {r.policy.key: r for r in results["step"]}
    headline = ", ".join(f"({k}) {r.under + r.over:,.0f}" for k, r in step.items())
    return Section(
        f"""## Decision quality (simulator)

`bench/simulator/gpu.py` steps one second at a time through a workload of pods with
{timing.gpus_per_pod} GPUs each. Demand is in pods' worth of work; the ready pods share it evenly and each
pod's GPUs run at min(100 %, its share); a new pod is ready {timing.pod_startup:g} s after it is created
and shows 0 % until then. dcgm-exporter refreshes its values every {timing.exporter_refresh:g} s; the
scaler scrapes it every 5 s, Prometheus every 15 s (with `kube_deployment_status_replicas` for the DOKS
query). The HPA syncs every {b.sync:g} s with a {100 * 0.1:g} % tolerance, scales up by at most
max({b.up_pods} pods, {b.up_percent:g} %) per {b.up_period:g} s and down only to the highest
recommendation of the last {b.down_window:g} s, all on `AverageValue` (`ceil(value / target)`), within
maxReplicaCount {timing.max_replicas}. KEDA polls `IsActive` every 30 s, scales 0 → 1 when active and to 0
after a 300 s cooldown (minReplicaCount 0 in the `idle` trace only); policy (a) also gets a
`StreamIsActive` push on each idle → busy change it sees. The loops tick at fixed, different phases.

Policies: **(a)** this scaler: the product's own `keda_gpu_scaler.core.scaling` code (per-pod mean over GPUs,
sum over the target's pods, missing pods filled as the product does) on what it scraped, threshold 70;
**(b)** AKS tutorial: `avg(DCGM_FI_DEV_GPU_UTIL)` over the GPUs, threshold 5; **(c)** DOKS tutorial:
`sum(gauge) / sum(kube_deployment_status_replicas)` with one gauge per pod, threshold 80; **(d)**
`sum(DCGM_FI_DEV_GPU_UTIL)` over GPUs without collapsing pods first, threshold 70.

Yardsticks: *under-provisioned* = GPU-seconds of demand with no ready GPU to run it (demand above the
ready pods' capacity, × {timing.gpus_per_pod} GPUs); *over-provisioned* = GPU-seconds of pods beyond what
running at {timing.target_utilization:g} % needs (`ceil(demand / 0.7)`); *time to steady state* = from
the trace's last change in demand to the last replica change in that stretch, provided nothing changes in
its last 10 minutes.

{chr(10).join(parts)}
Reading the results: (a) follows demand at the intended utilisation, paying only the reaction time
(exporter refresh + scrape + sync + pod start-up) as short under-provisioning on the way up; (b) settles
near `sqrt(20 × demand)` replicas (`ceil(20 × demand / replicas)` is its fixed point), far too many at low
load and oscillating between two counts; (c) can never ask for more than `ceil(100 / 80) = 2`; (d) counts
each 4-GPU pod four times and runs into maxReplicaCount. In the `idle` trace every policy scales to zero
after the cooldown and none can wake the workload again: with no pods there is no GPU series, so a
GPU-utilisation trigger cannot activate from zero on its own — pair it with a queue or HTTP trigger for
activation, or keep minReplicaCount ≥ 1.
""",
        [("Simulator, step trace: GPU-s under + over-provisioned", headline, "(a) lowest", None)],
    )
