"""What each cache pays: the scaler's CPU and RPC latency with one cache switched off at a time.

At a realistic size: 1,000 pods of 100 ScaledObjects (10 namespaces) on 125 nodes, each node's
dcgm-exporter page a whole one (every default family, 8 GPUs or more) whose values move every 30 s
(dcgm-exporter's default collection interval), scraped every 5 s, with pods replaced at 2 events/s, the
cluster served by the loopback Kubernetes API of the cluster benchmark (bench/bench_cluster.py). Each cache
is switched off through its own seam (a class attribute or module constant set to False by
bench/gcprobe/sitecustomize.py before the scaler starts), one `serve` process per configuration.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import grpc

from bench import bench_cluster
from bench.bench_cluster import OTHERS_CPU, Window, cluster, load_window, pb_grpc, scaler, warm
from bench.harness import Section, median
from keda_gpu_scaler.discovery.targets import Targets

# (name, switch as "module:Owner.attribute", what it keeps)
SWITCHES: tuple[tuple[str, str, str], ...] = (
    (
        "store views",
        "keda_gpu_scaler.collect.store:Store.keep_views",
        "one namespace's view of the store, shared by its ScaledObjects",
    ),
    (
        "store freshness",
        "keda_gpu_scaler.collect.store:Store.keep_freshness",
        "which node exporters are fresh, worked out once for every namespace",
    ),
    (
        "unchanged-page digest",
        "keda_gpu_scaler.collect.scrape:ScrapeCollector.reuse_unchanged_pages",
        "a page's readings when its next page is the same bytes",
    ),
    (
        "trigger parse cache",
        "keda_gpu_scaler.trigger:CACHE_PARSES",
        "the parsed TriggerSpec of each metadata map (lru_cache)",
    ),
)
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


async def _configuration(
    plan: bench_cluster.Plan,
    kubeconfig: str,
    control: int,
    session: aiohttp.ClientSession,
    off: list[str],
    floor: bool,
) -> tuple[Measured, Window | None]:
    env = {"BENCH_CACHES_OFF": ",".join(off)} if off else {}
    async with contextlib.AsyncExitStack() as stack:
        running, target = await stack.enter_async_context(scaler(kubeconfig, env))
        channel = await stack.enter_async_context(grpc.aio.insecure_channel(target))
        await warm(pb_grpc().ExternalScalerStub(channel), plan, deadline=180)
        windows = {}
        for rate in RATES:
            at = dataclasses.replace(plan, rate=rate)
            windows[rate] = (
                await load_window(at, target, running, session, control, plan.events_per_second)
            )[0]
        floor_window = None
        if floor:
            at = dataclasses.replace(plan, rate=RATES[-1])
            floor_window = (
                await load_window(
                    at, target, running, session, control, plan.events_per_second, health_only=True
                )
            )[0]
    return Measured(windows), floor_window


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


async def run(quick: bool = False) -> Section:
    affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {OTHERS_CPU})
    plan = QUICK if quick else PLAN
    repeats = 1 if quick else REPEATS
    configurations: list[tuple[str, list[str]]] = [(BASELINE, [])]
    configurations += [(name, [switch]) for name, switch, _ in SWITCHES]
    configurations.append((ALL_OFF, [switch for _, switch, _ in SWITCHES]))
    fast = [(name, off) for name, off in configurations if name == BASELINE or name in SCRAPE_PATH]
    try:
        results, floors = await _regime(plan, repeats, configurations)
        fast_plan = dataclasses.replace(plan, refresh=FAST_REFRESH)
        fast_results, fast_floors = await _regime(fast_plan, repeats, fast)
    finally:
        os.sched_setaffinity(0, affinity)
    return render(plan, repeats, (results, floors), (fast_results, fast_floors))


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
) -> Section:
    low, high = RATES
    what = "\n".join(f"| {name} | `{switch}` | {keeps} |" for name, switch, keeps in SWITCHES)
    return Section(
        f"""## Caches

What each of the scaler's caches and memos pays, switched off one at a time (and all together) in a
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
against the same server. Each switch is the cache's own seam (a class attribute or module constant), set to
False by `bench/gcprobe/sitecustomize.py` before the scaler starts.

Each node's values move every {plan.refresh:g} s (dcgm-exporter's default collection interval), each node
at its own phase: most scrapes find the page they found before.

{_table(*dcgm_default)}

The scrape path's cache again, with each node's values moving every {FAST_REFRESH:g} s (an exporter set to
collect every second): every scrape finds new values.

{_table(*fast)}

| cache | switch | what it keeps |
|---|---|---|
{what}
""",
        [],
    )


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


def per_operation() -> str:
    """A markdown table: each cache's work per use, on and off, at the size of the benchmark above."""
    from bench.pages import dcgm_page
    from keda_gpu_scaler import trigger
    from keda_gpu_scaler.collect import scrape
    from keda_gpu_scaler.collect.store import Page, Store
    from keda_gpu_scaler.evaluator import Evaluator
    from keda_gpu_scaler.metrics import Telemetry
    from keda_gpu_scaler.registry import Followed, Registry
    from keda_gpu_scaler.vendors import Family, GpuReading

    rows: list[tuple[str, float, float]] = []
    pods = [("main", f"ns-{i % 10}", f"w-{i % 10}-{i}") for i in range(8)]
    pages = [dcgm_page(8, seed=1, pods=pods, hostname="node-1", values_seed=v).encode() for v in range(2)]
    reader = scrape.GPU_EXPORTER_PAGES

    first = scrape._digest_and_read(pages[0], None, reader)
    previous = (first[0], Page("u", 0.0, first[1]))
    rows.append(
        (
            "unchanged-page digest: the same page again",
            _per_call_us(lambda: scrape._digest_and_read(pages[0], previous, reader)),
            _per_call_us(lambda: scrape._digest_and_read(pages[0], previous, reader, False)),
        )
    )
    metadata = {"threshold": "57", "activationThreshold": "5", "scalerAddress": "keda-gpu-scaler.keda:6000"}
    trigger.parse_trigger(metadata)
    cached_parse = _per_call_us(lambda: trigger.parse_trigger(metadata))
    trigger.CACHE_PARSES = False
    try:
        rows.append(
            (
                "trigger parse cache: one call's metadata",
                cached_parse,
                _per_call_us(lambda: trigger.parse_trigger(metadata)),
            )
        )
    finally:
        trigger.CACHE_PARSES = True
    # 125 node exporters, 1,000 pods in 10 namespaces of 10 ScaledObjects of 10 pods: one ScaledObject's call.
    now = [1000.0]
    spec = trigger.parse_trigger({"threshold": "50"})

    def evaluator(views: bool, freshness: bool) -> tuple[Evaluator, Followed, Any]:
        store = Store()
        store.keep_views, store.keep_freshness = views, freshness
        for node in range(125):
            readings = [
                GpuReading(
                    Family.NVIDIA,
                    f"ns-{pod % 10}",
                    f"w-{pod % 10}-{pod}",
                    f"GPU-{pod}",
                    f"n{node}",
                    50.0,
                    None,
                    False,
                    20.0,
                )
                for pod in range(node * 8, node * 8 + 8)
            ]
            store.record_page(Page.from_readings(f"http://node-{node}/metrics", now[0], readings))
        targets = Targets(frozenset(f"w-0-{pod}" for pod in range(0, 100, 10)), "AverageValue")
        resolver = _FixedTargets(targets)
        made = Evaluator(
            store=store, telemetry=Telemetry(), max_staleness=15.0, clock=lambda: now[0], targets=resolver
        )
        followed = Registry(ttl=600, cap=10, clock=lambda: now[0]).follow("ns-0", "w-0", spec)
        return made, followed, store

    views_on, f_views_on, _ = evaluator(True, True)
    views_off, f_views_off, _ = evaluator(False, True)
    fresh_off, f_fresh_off, _ = evaluator(False, False)
    rows.append(
        (
            "store views: an evaluation",
            _per_call_us(lambda: views_on.evaluate(f_views_on, spec)),
            _per_call_us(lambda: views_off.evaluate(f_views_off, spec)),
        )
    )
    rows.append(
        (
            "store freshness: an evaluation (views off)",
            _per_call_us(lambda: views_off.evaluate(f_views_off, spec)),
            _per_call_us(lambda: fresh_off.evaluate(f_fresh_off, spec)),
        )
    )
    lines = "\n".join(
        f"| {what} | {on_us:,.1f} | {off_us:,.1f} | {off_us - on_us:,.1f} |" for what, on_us, off_us in rows
    )
    return "| each use of | cache on µs | off µs | saved µs |\n|---|---|---|---|\n" + lines


class _FixedTargets:
    def __init__(self, targets: Targets) -> None:
        self.targets = targets

    def check(self, spec: Any) -> None:
        pass

    def resolve(self, namespace: str, name: str, spec: Any) -> Targets:
        return self.targets

    def forget(self, namespace: str, name: str) -> None:
        pass


if __name__ == "__main__":
    print(per_operation())
