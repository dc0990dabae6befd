"""PNG plots of LLM-fleet runs: replicas, Ready pods and what the load needs, with waiting requests."""

from __future__ import annotations

from pathlib import Path

from bench.simulator.llm_policies import OracleTrigger
from bench.simulator.llm_run import LlmRun


def plot(trace_name: str, runs: list[LlmRun], path: Path) -> None:
    import matplotlib  # type: ignore[import-not-found,unused-ignore]

    matplotlib.use("Agg")  # files only: no display here
    import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]

    columns = 3
    rows = -(-len(runs) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(12, 2.3 * rows), dpi=72, sharex=True, squeeze=False)
    top = max(max([*r.replicas, 0]) for r in runs) + 1
    queue_top = max(max([*r.waiting, 0]) for r in runs) * 1.05 + 1
    needs = OracleTrigger(runs[0].trace)  # replicas the true rate and mix need at the latency target
    for ax, run in zip(axes.flat, runs, strict=False):
        minutes = [t / 60 for t in run.times]
        needed = [needs.needed(t) for t in run.times]
        ax.fill_between(minutes, needed, step="post", color="black", alpha=0.12, label="replicas needed")
        ax.step(minutes, run.replicas, where="post", color="tab:blue", linewidth=1.3, label="replicas")
        ax.step(minutes, run.ready, where="post", color="tab:green", linewidth=0.9, label="ready")
        ax.set_ylim(0, top)
        ax.set_title(run.policy.name, fontsize=9)
        ax.tick_params(labelsize=7)
        queue = ax.twinx()
        queue.plot(
            minutes, run.waiting, color="tab:red", linewidth=0.8, label="waiting requests (right axis)"
        )
        queue.set_ylim(0, queue_top)
        queue.tick_params(labelsize=7, colors="tab:red")
        if ax is axes.flat[0]:
            lines, labels = ax.get_legend_handles_labels()
            queue_lines, queue_labels = queue.get_legend_handles_labels()
            fig.legend(
                lines + queue_lines,
                labels + queue_labels,
                loc="lower center",
                ncol=4,
                fontsize=8,
                frameon=False,
            )
    for ax in axes.flat[len(runs) :]:
        ax.set_visible(False)
    fig.suptitle(
        f"{trace_name}: replicas (left axis) and waiting requests (right axis) over minutes", fontsize=10
    )
    fig.tight_layout(rect=(0, 0.04, 1, 0.97))
    fig.savefig(path)
    plt.close(fig)
