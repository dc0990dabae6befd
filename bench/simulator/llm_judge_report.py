"""The SLO judge's part of docs/BENCHMARKS.md: per trace, each policy's frontier (GPU-seconds against SLO
attainment over its searched settings) as a PNG, and the chosen setting of each policy as a table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.simulator.llm_judge import frontier, judge
from bench.simulator.llm_run import Slo
from bench.simulator.llm_traces import LlmTrace

SLO = Slo(ttft=2.0, tpot=0.050)
GOAL = 0.95
HEADER = (
    "| policy | setting (threshold ×, down window) | GPU-s | SLO attainment | meets | TTFT p95 s | dropped |\n"
    "|---|---|---:|---:|---|---:|---:|"
)


def plot_frontier(trace: LlmTrace, rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib  # type: ignore[import-not-found,unused-ignore]

    matplotlib.use("Agg")  # files only: no display here
    import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=72)
    for policy, line in frontier(rows).items():
        star = policy == "recommended"  # one setting: a large star drawn on top, never hidden
        ax.plot(
            [g / 3600 for g, _ in line], [a for _, a in line], label=policy,
            marker="*" if star else "o", markersize=14 if star else 5, zorder=3 if star else 2,
        )  # fmt: skip
    ax.axhline(GOAL, color="black", linewidth=0.8, linestyle=":")
    ax.set_xlabel("GPU-hours")
    ax.set_ylabel(f"SLO attainment (TTFT ≤ {SLO.ttft:g} s, TPOT ≤ {1000 * SLO.tpot:g} ms)")
    ax.set_title(f"{trace.name}: each policy's settings that none of its others beats", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _row(r: dict[str, Any]) -> str:
    s = r["setting"]
    scale = "as in the README" if s["threshold_scale"] is None else f"{s['threshold_scale']:g}"
    return (
        f"| {r['policy']} | {scale}, {s['down_window_seconds']:g} s | {r['gpu_seconds']:,.0f}"
        f" | {r['slo_attainment']:.3f} | {'yes' if r['meets_slo'] else 'no'} | {r['ttft_p95_seconds']:.1f}"
        f" | {r['dropped_requests']} |"
    )


def judge_section(traces: list[LlmTrace], seed: int, docs: Path) -> str:
    parts = []
    for trace in traces:
        chosen, rows = judge(trace, seed, SLO, GOAL)
        plot_frontier(trace, rows, docs / f"llm-frontier-{trace.name}.png")
        table = "\n".join(_row(r) for r in sorted(chosen, key=lambda r: r["gpu_seconds"]))
        parts.append(
            f"#### {trace.name}: {trace.description}\n\n{HEADER}\n{table}\n\n"
            f"![{trace.name} frontier](llm-frontier-{trace.name}.png)\n"
        )
    return "\n".join(parts)
