"""Waking from zero: requests queue at the endpoint picker → StreamIsActive says true, scaler vs Prometheus;
and reading an EPP page with 1,000 models × 10 fairness ids, ours vs prometheus_client."""

from __future__ import annotations

import asyncio
import contextlib
import random
import timeit
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import aiohttp
import grpc
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from bench.harness import Prometheus, Section, median, prometheus, scaler
from keda_gpu_scaler.collect.gateway_source import gateway_reader
from keda_gpu_scaler.collect.scrape import read_page
from keda_gpu_scaler.demo.epp import Queued, epp_page
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb
from keda_gpu_scaler.externalscaler import externalscaler_pb2_grpc as pb_grpc
from keda_gpu_scaler.pages import pagetext
from keda_gpu_scaler.pages.exposition import parse_exposition as parse_all
from keda_gpu_scaler.pages.gateways import PoolQueue, epp, read_queue

POOL = "chat-pool"
NAMESPACE = "llm"
GATEWAY_INTERVAL = 1.0
# Where in the scaler's scrape cycle the requests start to queue: the time since its last scrape of the
# page, as a fraction of --gateway-interval.
PHASES = (0.05, 0.25, 0.5, 0.75, 0.95)
PROMETHEUS_SCRAPE = 15.0  # a ServiceMonitor's common interval (the EPP's chart default)
KEDA_POLLING = 30.0  # KEDA's default pollingInterval, which its prometheus trigger is read at
POLL_SECONDS = 0.01
PARSE_REPEATS = 7
PENDING = {"metric": "pending", "threshold": "1", "inferencePool": POOL}
READER = gateway_reader(NAMESPACE, POOL, "epp-0")


@dataclass
class EppPages:
    """Two endpoint-picker pages on one loopback server: one the scaler reads, one Prometheus scrapes.
    Each records when it was fetched (this process's loop clock)."""

    queued: dict[str, int] = field(default_factory=lambda: {"scaler": 0, "prometheus": 0})
    fetched: dict[str, list[float]] = field(default_factory=lambda: {"scaler": [], "prometheus": []})
    next_fetch: dict[str, asyncio.Event] = field(
        default_factory=lambda: {"scaler": asyncio.Event(), "prometheus": asyncio.Event()}
    )
    port: int = 0

    def url(self, which: str) -> str:
        return f"http://127.0.0.1:{self.port}{self.path(which)}"

    @staticmethod
    def path(which: str) -> str:
        return "/metrics" if which == "prometheus" else f"/{which}/metrics"  # Prometheus asks /metrics

    def page(self, which: str) -> str:
        count = self.queued[which]
        return epp_page(POOL, {Queued("meta-llama/Llama-3.1-8B-Instruct"): count})

    def handler(self, which: str) -> Callable[[web.Request], object]:
        async def handle(_: web.Request) -> web.Response:
            self.fetched[which].append(asyncio.get_running_loop().time())
            self.next_fetch[which].set()
            return web.Response(text=self.page(which), content_type="text/plain")

        return handle


@contextlib.asynccontextmanager
async def epp_pages() -> AsyncIterator[EppPages]:
    pages = EppPages()
    app = web.Application()
    for which in pages.queued:
        app.router.add_get(pages.path(which), pages.handler(which))  # type: ignore[arg-type]
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    pages.port = runner.addresses[0][1]
    try:
        yield pages
    finally:
        await runner.cleanup()


async def _scaler_trials(pages: EppPages, target: str, repeats: int) -> dict[float, list[float]]:
    """For each phase: time from the page showing requests until StreamIsActive sends true."""
    loop = asyncio.get_running_loop()
    ref = pb.ScaledObjectRef(name="chat", namespace=NAMESPACE, scalerMetadata=PENDING)
    woken: asyncio.Queue[float] = asyncio.Queue()
    results: dict[float, list[float]] = {phase: [] for phase in PHASES}
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.ExternalScalerStub(channel)
        await stub.GetMetricSpec(ref)
        stream = stub.StreamIsActive(ref)

        async def read() -> None:
            async for response in stream:
                if response.result:
                    woken.put_nowait(loop.time())

        reader = asyncio.create_task(read())
        try:
            order = [phase for phase in PHASES for _ in range(repeats)]
            random.Random(1).shuffle(order)
            for phase in order:
                pages.queued["scaler"] = 0
                while True:  # until the scaler has seen the queue empty
                    if await _active(stub, ref) is False:
                        break
                    await asyncio.sleep(POLL_SECONDS)
                pages.next_fetch["scaler"].clear()
                await pages.next_fetch["scaler"].wait()  # a scrape after that: the phase's origin
                last = pages.fetched["scaler"][-1]
                await asyncio.sleep(max(0.0, last + phase * GATEWAY_INTERVAL - loop.time()))
                while not woken.empty():
                    woken.get_nowait()
                queued_at = loop.time()
                pages.queued["scaler"] = 3
                results[phase].append(await asyncio.wait_for(woken.get(), 10 * GATEWAY_INTERVAL) - queued_at)
        finally:
            stream.cancel()
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
    return results


async def _active(stub: pb_grpc.ExternalScalerStub, ref: pb.ScaledObjectRef) -> bool | None:
    """IsActive, or None before the scaler has read the page once (UNAVAILABLE)."""
    try:
        return bool((await stub.IsActive(ref)).result)
    except grpc.aio.AioRpcError as error:
        if error.code() is grpc.StatusCode.UNAVAILABLE:
            return None
        raise


async def _prometheus_trials(pages: EppPages, prom: Prometheus, trials: int) -> list[float]:
    """Time from the page changing until an instant query of Prometheus shows it (scrape to query)."""
    loop = asyncio.get_running_loop()
    rng = random.Random(2)
    expr = f'sum(llm_d_epp_flow_control_queue_size{{job="epp",inference_pool="{POOL}"}})'
    delays: list[float] = []
    async with aiohttp.ClientSession() as session:
        while True:  # until the first scrape has landed
            if await prom.query(session, expr) == 0:
                break
            await asyncio.sleep(0.2)
        for trial in range(trials):
            await asyncio.sleep(rng.uniform(0, PROMETHEUS_SCRAPE))  # a random phase of its scrape cycle
            value = trial + 1
            changed_at = loop.time()
            pages.queued["prometheus"] = value
            while await prom.query(session, expr) != value:
                if loop.time() > changed_at + 3 * PROMETHEUS_SCRAPE:
                    raise RuntimeError("Prometheus never showed the change")
                await asyncio.sleep(POLL_SECONDS)
            delays.append(loop.time() - changed_at)
    return delays


def _keda_polled(delays: list[float]) -> list[float]:
    """The Prometheus path as KEDA reads it: each measured scrape-to-query delay plus the wait for KEDA's
    next poll, at every whole second of its 30 s polling cycle (uniform phase, modelled, not run)."""
    return [d + offset for d in delays for offset in range(int(KEDA_POLLING))]


def big_epp_page(models: int = 1000, fairness_ids: int = 10) -> str:
    """An EPP page at its cardinality caps: queue and running gauges for models × fairness ids, plus the
    Go runtime's families every client_golang page carries."""
    series = [
        (
            pagetext.label_text(
                [
                    ("fairness_id", f"tenant-{f:03d}"),
                    ("inference_pool", POOL),
                    ("model_name", f"org-{m % 37}/model-{m:04d}"),
                    ("priority", str(f % 3)),
                    ("target_model_name", f"org-{m % 37}/model-{m:04d}"),
                ]
            ),
            pagetext.go_float((m * 7 + f) % 5),
        )
        for m in range(models)
        for f in range(fairness_ids)
    ]
    running = [(labels.replace(f'inference_pool="{POOL}",', ""), value) for labels, value in series]
    runtime = [
        (f"go_gc_duration_seconds_{i}", "gauge", "A Go runtime figure.", [("", pagetext.go_float(i * 0.001))])
        for i in range(40)
    ]
    families: list[pagetext.Family] = [
        *runtime,
        (epp.REQUEST_RUNNING, "gauge", "Number of running requests by model.", running),
        (epp.SATURATION, "gauge", "Pool saturation.", [(f'inference_pool="{POOL}",stage="dispatch"', "1")]),
        (epp.QUEUE, "gauge", "Current number of requests held in the flow control queue.", series),
    ]
    return pagetext.render(families)


def _best_ms(function: Callable[[], object]) -> float:
    """ms per call in the fastest of PARSE_REPEATS timeit runs: the machine is shared with other work,
    and the fastest run is the one it disturbed least (the same rule for both parsers)."""
    timer = timeit.Timer(function)
    number, _ = timer.autorange()
    return min(timer.repeat(repeat=PARSE_REPEATS, number=number)) / number * 1e3


def _ours(page: bytes) -> float:
    """The scrape path (read_page with the gateway reader): the small families parsed, the queue summed
    per pool and model in one pass, then the pool's total as the evaluation reads it."""
    (replica,) = read_page(page, READER)["llm"]
    reading = read_queue(replica.table, POOL, NAMESPACE, None)  # type: ignore[attr-defined]
    assert isinstance(reading, PoolQueue)
    return reading.total


def _theirs(page: str) -> float:
    """What a Python user would write: prometheus_client's parser, then the queue family summed."""
    total = 0.0
    for family in text_string_to_metric_families(page):
        if family.name == epp.QUEUE:
            total += sum(sample.value for sample in family.samples)
    return total


def parse_rows() -> tuple[str, float]:
    text = big_epp_page()
    body = text.encode()
    assert _ours(body) == _theirs(text)
    samples = len(parse_all(text))
    ours = _best_ms(lambda: _ours(body))
    everything = _best_ms(lambda: parse_all(body))
    theirs = _best_ms(lambda: _theirs(text))
    row = (
        f"| EPP, 1,000 models × 10 fairness ids | {len(body) / 1024 / 1024:.1f} MiB, {samples:,} samples |"
        f" {ours:.1f} | {everything:.1f} | {theirs:.1f} | {theirs / ours:.0f}× |"
    )
    return row, theirs / ours


async def run(quick: bool = False) -> Section:
    repeats = 2 if quick else 6
    prometheus_trials = 3 if quick else 8
    async with epp_pages() as pages:
        serve = scaler(
            [],
            gateway_url=f"{NAMESPACE}/{POOL}={pages.url('scaler')}",
            gateway_interval=f"{GATEWAY_INTERVAL:g}",
        )
        async with (
            serve as running,
            prometheus({"epp": (PROMETHEUS_SCRAPE, [f"127.0.0.1:{pages.port}"])}) as prom,
        ):
            ours, theirs = await asyncio.gather(
                _scaler_trials(pages, running.target, repeats),
                _prometheus_trials(pages, prom, prometheus_trials),
            )
    every = [v for values in ours.values() for v in values]
    worst = max(every)
    goal = GATEWAY_INTERVAL + 0.2
    polled = _keda_polled(theirs)
    phase_rows = "\n".join(
        f"| {phase:.2f} × interval | {len(values)} | {median(values):.2f} | {max(values):.2f} |"
        for phase, values in ours.items()
    )
    parse_row, speedup = parse_rows()
    ratio = median(polled) / median(every)
    headlines: list[tuple[str, str, str, bool | None]] = [
        (
            "Wake from zero, EPP queue → StreamIsActive true: median / worst",
            f"{median(every):.2f} s / {worst:.2f} s",
            f"worst ≤ {goal:.1f} s",
            worst <= goal,
        ),
        (
            "Wake from zero, Prometheus 15 s + KEDA 30 s polling: median / worst",
            f"{median(polled):.1f} s / {max(polled):.1f} s ({ratio:.0f}× ours)",
            "–",
            None,
        ),
        (
            "Parse, EPP page 1,000 models × 10 fairness ids: speed-up over prometheus_client",
            f"{speedup:.0f}×",
            "≥ 30×",
            speedup >= 30,
        ),
    ]
    return Section(
        f"""## Waking from zero

**Wake latency.** An endpoint-picker page (`demo/epp.py`, llm-d-router's families) served on
loopback goes from an empty flow-control queue to 3 requests held; the clock stops when a
`StreamIsActive` stream of a `keda-gpu-scaler serve` subprocess (`--gateway-url`, `--gateway-interval
{GATEWAY_INTERVAL:g}`, a `pending` trigger) receives `true`. Each trial first waits until `IsActive` says
false, then until the scaler fetches the page again, and changes the page at a set phase after that
fetch ({repeats} trials per phase, in shuffled order). The clock starts before the page changes.

| requests queue at | trials | median s | worst s |
|---|---|---|---|
{phase_rows}

Worst over all phases {worst:.2f} s against a goal of {goal:.1f} s (`--gateway-interval` + 0.2 s):
{"met" if worst <= goal else "**missed**"}.
The scaler draws each wait up to the interval (never longer), so a change late in the cycle often meets
the next scrape at once: then the wake follows in milliseconds.

**The Prometheus path** a user would otherwise build (llm-d's KEDA guide): a real Prometheus scrapes
the same kind of page every {PROMETHEUS_SCRAPE:g} s, and the time until an instant query
(`sum(llm_d_epp_flow_control_queue_size{{…}})` on `/api/v1/query`, as KEDA's `prometheus` trigger asks)
shows the change was measured over {len(theirs)} changes at random phases of its scrape cycle: median
{median(theirs):.1f} s, worst {max(theirs):.1f} s. KEDA's `prometheus` trigger asks only every
`pollingInterval` ({KEDA_POLLING:g} s); that wait was **modelled, not run** (running 30 s polls often
enough would take an hour): each measured delay plus each whole second of the polling cycle, a uniform
phase. The result, {len(polled)} combinations: median {median(polled):.1f} s, worst {max(polled):.1f} s —
{ratio:.0f}× our median. Neither path includes the model server's own cold start (65–85 s for a vLLM pod
with warm caches), which follows the wake alike.

**Reading an EPP page at its cardinality caps.** ms per page, the fastest of {PARSE_REPEATS} timeit runs
for each (the machine is shared with other sessions: the fastest run is the least disturbed one).
*Ours* is the scrape path (`read_page` with the gateway's reader): the queue family summed per pool and
model in one pass over client_golang's layout (with the series limit and the check for a series printed
twice; any other layout goes through the general parser), the EPP's other families only looked up, then
the pool's total as the evaluation reads it; *ours, all* is the general parser on every sample;
prometheus_client is `text_string_to_metric_families` with the queue family summed.

| Page | Size | Ours ms | Ours, all ms | prometheus_client ms | Speed-up |
|---|---|---|---|---|---|
{parse_row}
""",
        headlines,
    )
