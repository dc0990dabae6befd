"""What each cache pays: the scaler's CPU and RPC latency with one cache switched off at a time; and what
the process's garbage-collector setting (one freeze after start-up) does to the RPC tail.

At a realistic size: 1,000 pods of 100 ScaledObjects (10 namespaces) on 125 nodes, each node's
dcgm-exporter page a whole one (every default family, 8 GPUs or more) whose values move every 30 s
(dcgm-exporter's default collection interval), scraped every 5 s, with pods replaced at 2 events/s, the
cluster served by the loopback Kubernetes API of the cluster benchmark (bench/bench_cluster.py). Each cache
is replaced with its simple version by monkeypatching (bench/cache_switches.py, applied by
bench/gcprobe/sitecustomize.py before the scaler starts), one `serve` process per configuration.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import grpc

from bench import bench_cluster
from bench.bench_cluster import OTHERS_CPU, Window, cluster, load_window, pb_grpc, scaler, warm
from bench.cache_switches import POLICIES, SWITCHES, switched_off
from bench.harness import Section, median

BASELINE = "every cache on"
ALL_OFF = "every cache off"
PLAN = bench_cluster.Plan(
    namespaces=10,
    workloads_per_namespace=10,
    pods_per_workload=10,
    nodes=125,
    events_per_second=2.0,
    window=10.0,
    windows=1,
    full_pages=True,
    refresh=30.0,
)
QUICK = dataclasses.replace(PLAN, window=4.0)
# KEDA's defaults (pollingInterval 30 s, the HPA every 15 s) make about 15 RPC/s for 100 ScaledObjects;
# 300 RPC/s is every ScaledObject polled about every second.
RATES = (30.0, 300.0)
REPEATS = 3


@dataclass(frozen=True)
class Measured:
    windows: dict[float, Window]  # by offered RPC/s
    full_gcs: dict[float, list[float]]  # by offered RPC/s: ms of each full collection of 1 ms or more


async def _configuration(
    plan: bench_cluster.Plan,
    kubeconfig: str,
    control: int,
    session: aiohttp.ClientSession,
    off: list[str],
    floor: bool,
) -> tuple[Measured, Window | None]:
    env = {"BENCH_CACHES_OFF": ";".join(off)} if off else {}
    async with contextlib.AsyncExitStack() as stack:
        running, target = await stack.enter_async_context(scaler(kubeconfig, env))
        channel = await stack.enter_async_context(grpc.aio.insecure_channel(target))
        await warm(pb_grpc().ExternalScalerStub(channel), plan, deadline=180)
        windows, full_gcs = {}, {}
        for rate in RATES:
            at = dataclasses.replace(plan, rate=rate)
            seen = len(running.gc_pauses)
            windows[rate] = (
                await load_window(at, target, running, session, control, plan.events_per_second)
            )[0]
            full_gcs[rate] = [ms for generation, ms in running.gc_pauses[seen:] if generation == 2]
        floor_window = None
        if floor:
            at = dataclasses.replace(plan, rate=RATES[-1])
            floor_window = (
                await load_window(
                    at, target, running, session, control, plan.events_per_second, health_only=True
                )
            )[0]
    return Measured(windows, full_gcs), floor_window


# The scrape path's cache again with every scrape finding new values (an exporter collecting every
# second, as many are set up): the case the digest is not for.
SCRAPE_PATH = ("unchanged-page digest",)
FAST_REFRESH = 1.0


async def _regime(
    plan: bench_cluster.Plan, repeats: int, configurations: list[tuple[str, list[str]]]
) -> tuple[dict[str, list[Measured]], list[Window]]:
    """Every configuration `repeats` times, in turn, against one cluster; and the floor of each all-on run."""
    results: dict[str, list[Measured]] = {name: [] for name, _ in configurations}
    floors: list[Window] = []
    async with cluster(plan) as (_, kubeconfig, control), aiohttp.ClientSession() as session:
        for _ in range(repeats):
            for name, off in configurations:
                measured, floor = await _configuration(
                    plan, kubeconfig, control, session, off, floor=name == BASELINE
                )
                results[name].append(measured)
                if floor is not None:
                    floors.append(floor)
    return results, floors


# The process policies (POLICIES) at the same size, each in longer windows: a full collection comes once
# every several seconds, and the RPC tail is what it can lengthen.
POLICY_BASELINE = "as `serve` sets it"
POLICY_WINDOW = 30.0
POLICY_REPEATS = 2


def _policy_configurations() -> list[tuple[str, list[str]]]:
    configurations: list[tuple[str, list[str]]] = [(POLICY_BASELINE, [])]
    configurations += [(name, [name]) for name in POLICIES]
    if len(POLICIES) > 1:
        configurations.append((" and ".join(POLICIES), list(POLICIES)))
    return configurations


async def run(quick: bool = False) -> Section:
    affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {OTHERS_CPU})
    plan = QUICK if quick else PLAN
    repeats = 1 if quick else REPEATS
    configurations: list[tuple[str, list[str]]] = [(BASELINE, [])]
    configurations += [(name, [name]) for name in SWITCHES]
    if len(SWITCHES) > 1:
        configurations.append((ALL_OFF, list(SWITCHES)))
    fast = [(name, off) for name, off in configurations if name == BASELINE or name in SCRAPE_PATH]
    try:
        results, floors = await _regime(plan, repeats, configurations)
        fast_plan = dataclasses.replace(plan, refresh=FAST_REFRESH)
        fast_results, fast_floors = await _regime(fast_plan, repeats, fast)
        policies: dict[str, list[Measured]] = {}
        if POLICIES:
            policy_plan = dataclasses.replace(plan, window=plan.window if quick else POLICY_WINDOW)
            policy_repeats = 1 if quick else POLICY_REPEATS
            policies = (await _regime(policy_plan, policy_repeats, _policy_configurations()))[0]
    finally:
        os.sched_setaffinity(0, affinity)
    return render(plan, repeats, (results, floors), (fast_results, fast_floors), policies)


def _policy_table(results: dict[str, list[Measured]]) -> str:
    """p50/p99 per rate (medians over runs, each run's p99 in brackets), full collections, loop lateness."""
    rows = []
    for name, runs in results.items():
        cells = [name]
        for rate in RATES:
            p50 = median([m.windows[rate].p50_ms for m in runs])
            p99s = [m.windows[rate].p99_ms for m in runs]
            each = " / ".join(f"{p:.2f}" for p in p99s)
            cells.append(f"{p50:.2f} / {median(p99s):.2f} ({each})")
        gcs = [ms for m in runs for rate in RATES for ms in m.full_gcs[rate]]
        seconds = sum(m.windows[rate].seconds for m in runs for rate in RATES)
        cells.append(f"{60 * len(gcs) / seconds:.1f}, longest {max(gcs, default=0.0):.1f}")
        late = median([m.windows[RATES[-1]].loop_late_p99_ms for m in runs])
        cells.append(f"{late:.2f}")
        cpu = " / ".join(f"{_cpu_ms(runs, rate):.0f}" for rate in RATES)
        cells.append(cpu)
        rows.append("| " + " | ".join(cells) + " |")
    low, high = RATES
    header = (
        f"| configuration | p50 / p99 ms at {low:g} RPC/s | p50 / p99 ms at {high:g} RPC/s |"
        f" full collections ≥ 1 ms per minute, longest ms | event loop late p99 ms at {high:g} RPC/s |"
        f" scaler CPU ms/s ({low:g} / {high:g} RPC/s) |\n|---|---|---|---|---|---|\n"
    )
    return header + "\n".join(rows)


def _cpu_ms(runs: list[Measured], rate: float) -> float:
    """Median CPU of the scaler in milliseconds per second of wall time."""
    return 1000 * median([m.windows[rate].scaler_cpu for m in runs])


def _table(results: dict[str, list[Measured]], floors: list[Window]) -> str:
    low, high = RATES
    base_low, base_high = _cpu_ms(results[BASELINE], low), _cpu_ms(results[BASELINE], high)
    rows = []
    for name, runs in results.items():
        cpu_low, cpu_high = _cpu_ms(runs, low), _cpu_ms(runs, high)
        p50 = median([m.windows[high].p50_ms for m in runs])
        p99 = median([m.windows[high].p99_ms for m in runs])
        errors = sum(m.windows[rate].errors for m in runs for rate in RATES)
        each_low = " / ".join(f"{1000 * m.windows[low].scaler_cpu:.0f}" for m in runs)
        each_high = " / ".join(f"{1000 * m.windows[high].scaler_cpu:.0f}" for m in runs)
        costs = (
            "–"
            if name == BASELINE
            else f"{cpu_low - base_low:+.0f} ({100 * (cpu_low - base_low) / base_low:+.0f} %) /"
            f" {cpu_high - base_high:+.0f} ({100 * (cpu_high - base_high) / base_high:+.0f} %)"
        )
        rows.append(
            f"| {name} | {cpu_low:.0f} ({each_low}) | {cpu_high:.0f} ({each_high}) | {costs} | {p50:.2f} |"
            f" {p99:.2f} | {errors} |"
        )
    floor_p50 = median([w.p50_ms for w in floors]) if floors else float("nan")
    floor_p99 = median([w.p99_ms for w in floors]) if floors else float("nan")
    rows.append(
        f"| gRPC health `Check` (the floor), every cache on | – | – | – | {floor_p50:.2f} | {floor_p99:.2f} | – |"
    )
    header = (
        f"| configuration | scaler CPU ms/s at {low:g} RPC/s | at {high:g} RPC/s |"
        f" off costs ms/s ({low:g} / {high:g} RPC/s) | p50 ms | p99 ms | errors |\n|---|---|---|---|---|---|---|\n"
    )
    return header + "\n".join(rows)


def render(
    plan: bench_cluster.Plan,
    repeats: int,
    dcgm_default: tuple[dict[str, list[Measured]], list[Window]],
    fast: tuple[dict[str, list[Measured]], list[Window]],
    policies: dict[str, list[Measured]],
) -> Section:
    low, high = RATES
    what = "\n".join(f"| {name} | {keeps} |" for name, keeps in SWITCHES.items())
    return Section(
        f"""## Caches

What each of the scaler's caches pays, switched off one at a time (and all together, where there are several) in a
`keda-gpu-scaler serve` pinned to one core, at a realistic size: {plan.pods:,} pods of {plan.objects}
ScaledObjects ({plan.namespaces} namespaces, Kubernetes discovery against the loopback API server of the
cluster benchmark) on {plan.nodes} nodes, each node's dcgm-exporter page a whole one (every default family,
one GPU per pod, idle GPUs up to 8; about 60 kB), scraped every {bench_cluster.SCRAPE_INTERVAL:g} s, with pods
replaced at {plan.events_per_second:g} events/s during every window. The KEDA-shaped client polls every
ScaledObject in turn, open-loop, at {low:g} RPC/s (about what KEDA's and the HPA's default intervals send
for {plan.objects} ScaledObjects) and at {high:g} RPC/s, {plan.window:g} s each. Scaler CPU is its `/proc`
CPU time per second of wall time (ms/s, median of {repeats} run(s), each run's in brackets); "off costs" is
that CPU minus the all-on one, at each rate: positive, the cache saves that much. Latency is per RPC at
{high:g} RPC/s, measured in the client; the floor is the gRPC health service's `Check` at the same rate
against the same server. Each switch replaces the cache with its simple version by monkeypatching
(`bench/cache_switches.py`, applied by `bench/gcprobe/sitecustomize.py` before the scaler starts): the
scaler itself has no switch.

Each node's values move every {plan.refresh:g} s (dcgm-exporter's default collection interval), each node
at its own phase: most scrapes find the page they found before.

{_table(*dcgm_default)}

The scrape path's cache again, with each node's values moving every {FAST_REFRESH:g} s (an exporter set to
collect every second): every scrape finds new values.

{_table(*fast)}

| cache (switch in bench/cache_switches.py) | what it keeps |
|---|---|
{what}
{_policies(plan, policies)}""",
        [],
    )


def _policies(plan: bench_cluster.Plan, results: dict[str, list[Measured]]) -> str:
    if not results:
        return ""
    window = next(iter(results.values()))[0].windows[RATES[0]].seconds
    what = "\n".join(f"| {name} | {does} |" for name, does in POLICIES.items())
    return f"""
### The garbage collector

The same cluster and load, each configuration's process policy switched the same way, {len(next(iter(results.values())))}
run(s) each with windows of about {window:.0f} s per rate. Full collections are the scaler's generation-2
collections of 1 ms or more (its GC probe); "late" is how late its event loop ran a task due then.

{_policy_table(results)}

| policy (switch in bench/cache_switches.py) | switched off |
|---|---|
{what}
"""


# --- per operation, in this process: what each cache saves each time it is used ------------------------


def _per_call_us(call: Callable[[], object], seconds: float = 0.3) -> float:
    """Median µs of one call, over 5 batches of about `seconds` each."""
    count = 1
    while True:
        started = time.perf_counter()
        for _ in range(count):
            call()
        took = time.perf_counter() - started
        if took > seconds / 5:
            break
        count *= 2
    batches = []
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(count):
            call()
        batches.append((time.perf_counter() - started) / count)
    return 1e6 * median(batches)


def _timed(call: Callable[[], object], *off: str) -> float:
    """_per_call_us(call) with the named caches switched off."""
    with switched_off(*off):
        return _per_call_us(call)


def per_operation() -> str:
    """A markdown table: each cache's work per use, on and off, at the size of the benchmark above."""
    from bench.pages import dcgm_page
    from keda_gpu_scaler.collect import scrape
    from keda_gpu_scaler.collect.store import Page

    rows: list[tuple[str, float, float]] = []
    pods = [("main", f"ns-{i % 10}", f"w-{i % 10}-{i}") for i in range(8)]
    pages = [dcgm_page(8, seed=1, pods=pods, hostname="node-1", values_seed=v).encode() for v in range(2)]
    reader = scrape.GPU_EXPORTER_PAGES

    first = scrape.digest_and_read(pages[0], None, reader)
    previous = (first[0], Page("u", 0.0, first[1]))

    def same_page_again() -> object:
        return scrape.digest_and_read(pages[0], previous, reader)

    rows.append(
        (
            "unchanged-page digest: the same page again",
            _timed(same_page_again),
            _timed(same_page_again, "unchanged-page digest"),
        )
    )
    lines = "\n".join(
        f"| {what} | {on_us:,.1f} | {off_us:,.1f} | {off_us - on_us:,.1f} |" for what, on_us, off_us in rows
    )
    return "| each use of | cache on µs | off µs | saved µs |\n|---|---|---|---|\n" + lines


if __name__ == "__main__":
    print(per_operation())
