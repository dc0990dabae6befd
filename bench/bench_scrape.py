"""Scrape cost: CPU per 1,000 exporter pages, the scaler (`serve`) against a real Prometheus server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import grpc

from bench.harness import (
    PageServer,
    Section,
    categorise,
    median,
    page_server,
    profile,
    prometheus,
    scaler,
    trigger_ref,
)
from bench.pages import dcgm_page
from keda_gpu_scaler.externalscaler import externalscaler_pb2_grpc as pb_grpc
from keda_gpu_scaler.pages.vendors import SAMPLE_NAMES

# The goals: ≤ 0.4× Prometheus when pages are unchanged, ≤ 0.6× when every page is new.
GOAL_UNCHANGED = 0.4
GOAL_NEW = 0.6
PROFILE_RULES = (
    ("HTTP client (collect/http.py over aiohttp: request, answer, body)", "collect/http.py"),
    ("parsing the page (exposition.py)", "parse_exposition"),
    ("per-GPU readings (vendors/)", "readings_from_samples"),
    ("unchanged-page digest (XXH3)", "digest_and_read"),
    ("store and scrape metrics", "record_page"),
    ("store and scrape metrics", "scrape_done"),
)
PROFILE_REST = "event loop, timers, task switches, gRPC runtime"


@dataclass(frozen=True)
class Plan:
    targets: int = 100
    interval: float = 1.0
    warmup: float = 3.0
    window: float = 20.0
    repeats: int = 3


QUICK = Plan(targets=10, warmup=1.0, window=4.0, repeats=1)


@dataclass(frozen=True)
class Sample:
    cpu: float
    pages: int

    @property
    def per_thousand(self) -> float:
        return 1000 * self.cpu / self.pages if self.pages else float("nan")


async def _window(
    session: aiohttp.ClientSession, pages: PageServer, cpu: Callable[[], float], plan: Plan
) -> Sample:
    # Prometheus applies new targets only every 5 s: first wait until every target is being scraped.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while loop.time() < deadline:
        before = await pages.requests(session)
        await asyncio.sleep(plan.interval)
        if await pages.requests(session) - before >= 0.9 * plan.targets:
            break
    await asyncio.sleep(plan.warmup)
    cpu0, req0 = cpu(), await pages.requests(session)
    await asyncio.sleep(plan.window)
    cpu1, req1 = cpu(), await pages.requests(session)
    return Sample(cpu1 - cpu0, req1 - req0)


async def measure_scaler(
    session: aiohttp.ClientSession, pages: PageServer, plan: Plan, *, profiled: bool = False
) -> tuple[Sample, str]:
    urls = [pages.url(i) for i in range(plan.targets)]
    async with (
        scaler(urls, scrape_interval=f"{plan.interval:g}") as running,
        grpc.aio.insecure_channel(running.target) as channel,
    ):
        # The scaler scrapes only while a trigger wants data: GetMetricSpec starts it (the interest TTL,
        # 600 s, outlasts the window, as KEDA's polling would keep it alive).
        await pb_grpc.ExternalScalerStub(channel).GetMetricSpec(trigger_ref("bench", "llm"))
        sample = await _window(session, pages, running.child.cpu, plan)
        table = ""
        if profiled:
            stacks = await profile(running.child.pid, plan.window)
            table = categorise(stacks, PROFILE_RULES, PROFILE_REST)
        return sample, table


async def measure_prometheus(session: aiohttp.ClientSession, pages: PageServer, plan: Plan) -> Sample:
    targets = [f"127.0.0.1:{pages.ports[i]}" for i in range(plan.targets)]
    async with prometheus({"gpus": (plan.interval, targets)}) as prom:
        return await _window(session, pages, prom.child.cpu, plan)


@dataclass(frozen=True)
class Mode:
    label: str
    refresh: float  # seconds between page changes (0: a new page on every scrape)
    every_value: bool  # a change moves every value on the page, not one GPU's utilisation
    goal: float


# How the exporters' pages change. dcgm-exporter refreshes its values every 30 s by default and the scaler
# skips a page whose bytes did not change: the worst case (every value moves on every scrape), a new page
# with one value moved (what a cache of lines printed before would gain on), and the usual case.
MODES: tuple[Mode, ...] = (
    Mode("every value new on every scrape (worst case)", 0.0, True, GOAL_NEW),
    Mode("a new page on every scrape, one value moved", 0.0, False, GOAL_NEW),
    Mode("pages refreshed every 30 s (dcgm-exporter's default)", 30.0, False, GOAL_UNCHANGED),
)


@dataclass(frozen=True)
class ModeResult:
    label: str
    goal: float
    ours: list[Sample]
    theirs: list[Sample]
    profile: str

    @property
    def ratio(self) -> float:
        return median([s.per_thousand for s in self.ours]) / median([s.per_thousand for s in self.theirs])


async def run(quick: bool = False) -> Section:
    plan = QUICK if quick else Plan()
    results: list[ModeResult] = []
    for mode in MODES:
        ours: list[Sample] = []
        theirs: list[Sample] = []
        table = ""
        async with (
            page_server(plan.targets, refresh=mode.refresh, every_value=mode.every_value) as pages,
            aiohttp.ClientSession() as session,
        ):
            # Interleaved, so a drift of the machine's speed during the run touches both sides alike.
            for _ in range(plan.repeats):
                ours.append((await measure_scaler(session, pages, plan))[0])
                theirs.append(await measure_prometheus(session, pages, plan))
            result = ModeResult(mode.label, mode.goal, ours, theirs, "")
            if result.ratio > mode.goal:
                # A separate, unmeasured window: the profiler's own sampling must not count in the figures.
                table = (await measure_scaler(session, pages, plan, profiled=True))[1]
        results.append(ModeResult(mode.label, mode.goal, ours, theirs, table))
    section = render(plan, results)
    stall = await loop_stall(hostile_series=50_000 if quick else 150_000)
    return Section(section.markdown + stall, section.headlines)


# --- one huge page that changes on every scrape: how long does the event loop wait? ---------------------


def _huge_page(series: int, shift: int) -> bytes:
    lines = ["# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).", "# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    for i in range(series):
        lines.append(
            f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i % 8}",UUID="GPU-{i:08d}",Hostname="node-{i // 8}",'
            f'namespace="ns{i % 50}",pod="pod-{i // 8}"}} {(i + shift) % 100}'
        )
    return ("\n".join(lines) + "\n").encode()


class _Pages:
    """A fetcher that answers two alternating versions of one page (every value moved by one)."""

    def __init__(self, series: int) -> None:
        self.bodies = (_huge_page(series, 0), _huge_page(series, 1))
        self.count = 0

    async def get(self, url: str) -> bytes:
        self.count += 1
        return self.bodies[self.count % 2]


async def _probe(stop: asyncio.Event, late: list[float]) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        started = loop.time()
        await asyncio.sleep(0.001)
        late.append(loop.time() - started - 0.001)


async def loop_stall(hostile_series: int = 150_000, scrapes: int = 3) -> str:
    """Scrape big changing pages a few times in this process while a probe task sleeps 1 ms in a loop:
    how late the probe wakes is how long any RPC would wait. Two pages: one at the series limit (read),
    one far above it (refused); each read in a worker thread (the product) and on the loop (as before)."""
    import time

    from keda_gpu_scaler.collect import scrape
    from keda_gpu_scaler.collect.store import Store
    from keda_gpu_scaler.collect.wanted import WantedSources
    from keda_gpu_scaler.telemetry import Telemetry

    rows = []
    for series in (scrape.MAX_SERIES_PER_PAGE, hostile_series):
        pages = _Pages(series)
        size = len(pages.bodies[0]) / 1e6
        for label, threshold in (
            ("worker thread (now)", scrape.PARSE_OFF_LOOP_BYTES),
            ("on the loop (before)", 1 << 40),
        ):
            saved, scrape.PARSE_OFF_LOOP_BYTES = scrape.PARSE_OFF_LOOP_BYTES, threshold
            try:
                collector = scrape.ScrapeCollector(
                    fetcher=pages,
                    store=Store(),
                    interest=WantedSources(),
                    limits=scrape.ScrapeLimits(1.0, 60.0, 1 << 30, 4),
                    telemetry=Telemetry(),
                    clock=time.monotonic,
                )
                stop, late = asyncio.Event(), list[float]()
                probe = asyncio.create_task(_probe(stop, late))
                await asyncio.sleep(0.01)  # the probe is sleeping when the first scrape starts
                started = time.perf_counter()
                outcomes = {await collector.scrape_once("http://huge/metrics") for _ in range(scrapes)}
                seconds = (time.perf_counter() - started) / scrapes
                stop.set()
                await probe
            finally:
                scrape.PARSE_OFF_LOOP_BYTES = saved
            late.sort()
            p99 = late[min(len(late) - 1, int(len(late) * 0.99))]
            outcome = "read" if outcomes == {True} else "refused" if outcomes == {False} else "mixed"
            rows.append(
                f"| {series:,} series, {size:.1f} MB: {outcome} | {label} | {seconds:.2f} | {len(late):,}"
                f" | {1000 * p99:.1f} | {1000 * late[-1]:.0f} |"
            )
    table = "\n".join(rows)
    return f"""
### Big pages that change on every scrape: the event loop

Exporter pages that change on every scrape, each read {scrapes} times by a `ScrapeCollector` in the
benchmark's own process (a stub fetcher hands it the bytes), while a probe task sleeps 1 ms in a loop:
how late it wakes is how long an RPC would wait for the loop. One page at the series limit
(`MAX_SERIES_PER_PAGE`, {scrape.MAX_SERIES_PER_PAGE:,}: read), one of {hostile_series:,} series (refused: in the worker thread
after a search for its lines, before any parse; on the loop once the parse reaches the limit). Pages above {scrape.PARSE_OFF_LOOP_BYTES // 1024} KiB are hashed, parsed and turned into readings in a
worker thread, big structures freed in slices. What still holds the loop: single long C calls in the
worker (splitting the text, sorting the readings) and the garbage collector's full passes, which walk
every object of the process while holding the GIL (pausing the collector instead kept cyclic garbage
alive: a leak).

| page | where it is read | seconds per scrape | probe wake-ups | probe lateness p99 ms | worst ms |
|---|---|---|---|---|---|
{table}
"""


def _mode_table(result: ModeResult) -> str:
    rows = "\n".join(
        f"| {i + 1} | {x.pages:,} | {x.cpu:.2f} | {x.per_thousand:.3f} | {y.pages:,} | {y.cpu:.2f} | {y.per_thousand:.3f} |"
        for i, (x, y) in enumerate(zip(result.ours, result.theirs, strict=True))
    )
    a = median([s.per_thousand for s in result.ours])
    b = median([s.per_thousand for s in result.theirs])
    ok = result.ratio <= result.goal
    text = f"""### {result.label[0].upper()}{result.label[1:]}

| run | scaler pages | scaler CPU s | scaler CPU s / 1,000 pages | Prometheus pages | Prometheus CPU s | Prometheus CPU s / 1,000 pages |
|---|---|---|---|---|---|---|
{rows}

**Median: scaler {a:.3f} CPU s per 1,000 pages, Prometheus {b:.3f}: ratio {result.ratio:.2f}×** (goal ≤
{result.goal:g}×: {"met" if ok else "**missed**"}).
"""
    if result.profile:
        text += f"""
Per page the scaler spends {a:.2f} ms of CPU here, Prometheus {b:.2f} ms: the goal needs {result.goal * b:.2f} ms. A
py-spy profile of the scaler in an extra window (samples of the thread holding the GIL, i.e. Python code
and the C code it calls; kernel time for the sockets is not in it):

{result.profile}
"""
    return text


def render(plan: Plan, results: list[ModeResult]) -> Section:
    size = len(dcgm_page(gpus=8).encode())
    explanation = ""
    if any(r.ratio > r.goal for r in results):
        explanation = f"""
### Where the rest goes, and what would close it

A page whose bytes did not change since the last scrape is not parsed again (an XXH3-128 digest of the
body is compared): only its age is renewed. A new page is parsed by one regular expression that finds
the wanted lines ({len(SAMPLE_NAMES)} names merged into a prefix tree) and splits them, and a label set
is worked out once per page by the vendor reader (no memo of the previous page's label sets or reading
plans: they paid only when every scrape brings a new page; "Caches" below). Scrapes wake on a grid of 20 slots per
interval, so the scrapes due in one slot share a turn of the event loop. (Not parsing again the lines an
exporter printed on its previous page was tried: no gain beyond the noise, for 42 MiB more per 1,000
exporters; it was removed.) What is left on a new page is the pass of the regular expression over the
whole page (~100 µs for 71 kB here), the vendor reader's per-label-set and per-GPU work (~110 µs: facts,
pod resolution, the per-pod readings), the digest (~45 µs) and the fetch. Cutting it further needs the
reader's per-page structure (which series feeds which reading) kept per exporter like the label sets, so
a page of new values only moves numbers, or the fetch, digest and line search in C.
"""
    sections = "\n".join(_mode_table(r) for r in results)
    return Section(
        f"""## Scrape cost

{plan.targets} loopback exporters, each an 8-GPU dcgm-exporter page ({size / 1000:.0f} kB, every default
family), scraped every {plan.interval:g} s by a `keda-gpu-scaler serve` subprocess (one `GetMetricSpec`
made it want data) and, in the same run, by a real Prometheus server (Debian package `prometheus`,
TSDB on local disk, no rules, no self-scrape) with the same targets and interval. CPU is user + system
time of the whole process (all threads) from `/proc/PID/stat` over a {plan.window:g} s window, once every
target is being scraped and after {plan.warmup:g} s more; pages are the requests the page server (a
separate process) answered in that window. Runs are interleaved (scaler, Prometheus, scaler, …). Three
cases: {", ".join(r.label for r in results[:-1])}, and {results[-1].label}. Both sides include each process's fixed background
work (the scaler's gRPC threads; Prometheus's TSDB head, WAL and Go runtime). A Prometheus-based setup
also pays for KEDA's queries and for the extra series, which are not counted here.

{sections}{explanation}""",
        [
            (
                f"Scrape CPU per page, scaler ÷ Prometheus, {r.label}",
                f"{r.ratio:.2f}×",
                f"≤ {r.goal:g}×",
                r.ratio <= r.goal,
            )
            for r in results
        ],
    )
