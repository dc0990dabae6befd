"""Soak: 10,000 distinct ScaledObjects come and go; the scaler's state, /metrics and RSS stay bounded.

A real `keda-gpu-scaler serve` (Kubernetes off, loopback exporters, a short --interest-ttl) is driven by
ScaledObjects that each live a few seconds (GetMetricSpec, then GetMetrics + IsActive twice, KEDA's
order), each with its own name and namespace, arriving at a steady rate. Sampled every few seconds:
the scaler's RSS (/proc VmRSS), its /metrics page (bytes, series) and keda_gpu_scaler_scaledobjects_followed.
After the churn: everything is left to expire, then more ScaledObjects than --max-scaledobjects arrive at
once (the excess must be RESOURCE_EXHAUSTED) and the refused ones are retried once the others expired.

Writes its section of docs/SOAK.md. Run: `python -m bench.soak_registry --minutes 4` (`make soak`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import platform
import re
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import grpc

from bench.harness import ROOT, page_server, rss_mib, scaler
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb
from keda_gpu_scaler.externalscaler import externalscaler_pb2_grpc as pb_grpc

SECTION = "soak-registry"
EXPORTERS = 3
SCRAPE_INTERVAL = 1.0
POLLS_PER_OBJECT = 2  # GetMetrics + IsActive, this many times, POLL_EVERY apart
POLL_EVERY = 2.0
SAMPLE_EVERY = 5.0
FOLLOWED = "keda_gpu_scaler_scaledobjects_followed"


def ref_for(prefix: str, index: int) -> pb.ScaledObjectRef:
    """A distinct ScaledObject: its own name and its own namespace (valid DNS-1123 names)."""
    return pb.ScaledObjectRef(
        name=f"{prefix}-so-{index}",
        namespace=f"{prefix}-ns-{index}",
        scalerMetadata={"podNamePrefix": "vllm-", "threshold": "60", "activationThreshold": "5"},
    )


@dataclass
class Sample:
    at: float
    seen: int  # distinct ScaledObjects called so far
    rss_mib: float
    metrics_bytes: int
    metrics_series: int
    followed: float


def metrics_summary(text: str) -> tuple[int, int, float]:
    """(bytes, series, the followed gauge) of a /metrics page."""
    series = 0
    followed = float("nan")
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series += 1
        if line.startswith(FOLLOWED + " "):
            followed = float(line.split()[1])
    return len(text.encode()), series, followed


def product_commit() -> str:
    """The commit the measured scaler ran from (with "+ local changes" when keda_gpu_scaler/ differs)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "diff", "--quiet", "HEAD", "--", "keda_gpu_scaler"], cwd=ROOT
        ).returncode
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" + local changes" if dirty else "")


def write_section(path: Path, key: str, markdown: str) -> None:
    """Put one soak's section into docs/SOAK.md between its markers, keeping every other section."""
    begin, end = f"<!-- {key}:begin -->", f"<!-- {key}:end -->"
    block = f"{begin}\n{markdown.rstrip()}\n{end}\n"
    text = path.read_text() if path.exists() else ""
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end) + r"\n?", re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip() + "\n\n" + block if text.strip() else block
    path.write_text(text)


async def run(minutes: float, objects: int, ttl: float, cap: int) -> str:
    # The tail after the churn: everything expires (TTL + sweep), then the cap is tried and recovered.
    tail = 2 * ttl + 30
    churn_seconds = minutes * 60 - tail
    if churn_seconds < 30:
        raise SystemExit(
            f"--minutes {minutes:g} leaves {churn_seconds:.0f}s of churn; at least 30 s are needed"
        )
    rate = objects / churn_seconds
    commit = product_commit()  # the scaler below imports the product as it is now
    codes: Counter[str] = Counter()
    samples: list[Sample] = []
    seen = 0
    async with (
        page_server(EXPORTERS) as pages,
        scaler(
            [pages.url(i) for i in range(EXPORTERS)],
            scrape_interval=str(SCRAPE_INTERVAL),
            interest_ttl=f"{ttl:g}",
            max_scaledobjects=str(cap),
            explain="off",
        ) as server,
    ):
        channel = grpc.aio.insecure_channel(server.target)
        stub = pb_grpc.ExternalScalerStub(channel)
        pid = server.child.pid
        http = aiohttp.ClientSession()
        t0 = time.monotonic()

        async def call(method: str, request: object, tally: Counter[str] = codes) -> str:
            try:
                await getattr(stub, method)(request)
                code = "OK"
            except grpc.aio.AioRpcError as error:
                code = error.code().name
            tally[f"{method} {code}"] += 1
            return code

        async def sample() -> None:
            async with http.get(f"http://127.0.0.1:{server.http_port}/metrics") as response:
                page = await response.text()
            size, series, followed = metrics_summary(page)
            samples.append(Sample(time.monotonic() - t0, seen, rss_mib(pid)[0], size, series, followed))

        async def sampler() -> None:
            while True:
                await sample()
                await asyncio.sleep(SAMPLE_EVERY)

        async def lifecycle(index: int) -> None:
            ref = ref_for("churn", index)
            await call("GetMetricSpec", ref)
            for poll in range(POLLS_PER_OBJECT):
                if poll:
                    await asyncio.sleep(POLL_EVERY)
                await call(
                    "GetMetrics", pb.GetMetricsRequest(scaledObjectRef=ref, metricName="gpu-utilization")
                )
                await call("IsActive", ref)

        # Every exporter scraped once before the first call, so answers are values, not "no data yet".
        await asyncio.sleep(3 * SCRAPE_INTERVAL)
        sampling = asyncio.create_task(sampler())
        tasks: set[asyncio.Task[None]] = set()
        started = time.monotonic()
        worst_lag = 0.0
        for index in range(objects):
            due = started + index / rate
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            worst_lag = max(worst_lag, time.monotonic() - due)
            seen = index + 1
            task = asyncio.create_task(lifecycle(index))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
        churn_end = time.monotonic() - t0
        # Let every ScaledObject expire: TTL after its last call, plus the background sweep's period.
        await asyncio.sleep(ttl + max(ttl / 10, 1.0) + 2 * SAMPLE_EVERY)
        drained = samples[-1]

        # The cap: more new ScaledObjects than --max-scaledobjects at once (50 calls in flight).
        burst = cap + cap // 5
        burst_codes: Counter[str] = Counter()
        refused: list[int] = []
        queue = list(range(burst))

        async def burst_worker() -> None:
            while queue:
                index = queue.pop(0)
                if await call("GetMetricSpec", ref_for("burst", index), burst_codes) == "RESOURCE_EXHAUSTED":
                    refused.append(index)

        burst_started = time.monotonic()
        await asyncio.gather(*(burst_worker() for _ in range(50)))
        burst_seconds = time.monotonic() - burst_started
        await sample()
        at_cap = samples[-1]
        # A refused ScaledObject is retried (KEDA does, every polling interval) until others expired.
        retry_codes: Counter[str] = Counter()
        retried_at = 0.0
        while time.monotonic() - burst_started < ttl + 15:
            await asyncio.sleep(2)
            probe = (
                await call("GetMetricSpec", ref_for("burst", refused[0]), retry_codes) if refused else "OK"
            )
            if probe == "OK":
                retried_at = time.monotonic() - burst_started
                break
        recovered: Counter[str] = Counter()
        for index in refused[1:]:
            await call("GetMetricSpec", ref_for("burst", index), recovered)
        await sample()
        after_retry = samples[-1]
        sampling.cancel()
        await http.close()
        await channel.close()
        server_tail = list(server.child.tail)

    return report(
        commit=commit,
        minutes=minutes,
        objects=objects,
        ttl=ttl,
        cap=cap,
        rate=rate,
        churn_end=churn_end,
        worst_lag=worst_lag,
        codes=codes,
        samples=samples,
        drained=drained,
        burst=burst,
        burst_seconds=burst_seconds,
        burst_codes=burst_codes,
        refused=len(refused),
        at_cap=at_cap,
        retried_at=retried_at,
        retry_codes=retry_codes,
        recovered=recovered,
        after_retry=after_retry,
        server_errors=[line for line in server_tail if "Traceback" in line or "ERROR" in line][:5],
    )


def report(**r: object) -> str:
    samples: list[Sample] = r["samples"]  # type: ignore[assignment]
    ttl: float = r["ttl"]  # type: ignore[assignment]
    churn_end: float = r["churn_end"]  # type: ignore[assignment]
    # Steady state: from one TTL (plus the objects' own life) after the start until the churn ends.
    steady = [s for s in samples if ttl + POLL_EVERY * POLLS_PER_OBJECT + 10 <= s.at <= churn_end]
    steady = steady or samples
    quarter = max(1, len(steady) // 4)
    first, last = steady[:quarter], steady[-quarter:]

    def mean(values: list[float]) -> float:
        return sum(values) / len(values)

    def spread(pick: str, fmt: str) -> str:
        values = [getattr(s, pick) for s in steady]
        return f"{format(min(values), fmt)} … {format(max(values), fmt)}"

    rss_growth = mean([s.rss_mib for s in last]) - mean([s.rss_mib for s in first])
    seen_growth = mean([s.seen for s in last]) - mean([s.seen for s in first])
    drained: Sample = r["drained"]  # type: ignore[assignment]
    at_cap: Sample = r["at_cap"]  # type: ignore[assignment]
    after: Sample = r["after_retry"]  # type: ignore[assignment]
    codes: Counter[str] = r["codes"]  # type: ignore[assignment]
    rows = [
        f"| {s.at:.0f} | {s.seen} | {s.followed:.0f} | {s.rss_mib:.1f} | {s.metrics_bytes} | {s.metrics_series} |"
        for s in samples[:: max(1, len(samples) // 16)]
    ]
    minutes: float = r["minutes"]  # type: ignore[assignment]
    lines = [
        "## Soak: 10,000 ScaledObjects come and go (registry, --interest-ttl, --max-scaledobjects)",
        "",
        f"Date: {datetime.date.today().isoformat()}. Machine: {platform.machine()}, 2 cores (shared), Python"
        f" {platform.python_version()}.",
        f"Command: `python -m bench.soak_registry --minutes {minutes:g}` (`make soak`). Product: commit {r['commit']}.",
        "",
        f"Setup: `keda-gpu-scaler serve --kubernetes off --interest-ttl {ttl:g} --max-scaledobjects {r['cap']}"
        f" --explain off --scrape-interval {SCRAPE_INTERVAL:g}` with {EXPORTERS} loopback exporters (8-GPU"
        f" dcgm-exporter pages); {r['objects']} distinct ScaledObjects (each its own name and namespace)"
        f" arrive at {r['rate']:.1f}/s over {churn_end:.0f} s; each gets GetMetricSpec, then GetMetrics +"
        f" IsActive {POLLS_PER_OBJECT} times {POLL_EVERY:g} s apart, then is never called again. Sampled every"
        f" {SAMPLE_EVERY:g} s: VmRSS, the /metrics page and `{FOLLOWED}`.",
        "",
        "| t (s) | ScaledObjects seen | followed | RSS (MiB) | /metrics bytes | /metrics series |",
        "|---|---|---|---|---|---|",
        *rows,
        "",
        f"Steady state ({steady[0].at:.0f}–{steady[-1].at:.0f} s, while {steady[0].seen}–{steady[-1].seen}"
        " ScaledObjects had been seen):",
        "",
        "| check | result |",
        "|---|---|",
        f"| calls during the churn | {dict(sorted(codes.items()))} |",
        f"| worst lag of the arrival schedule | {r['worst_lag']:.2f} s |",
        f"| followed (gauge), min … max | {spread('followed', '.0f')} |",
        f"| /metrics bytes, min … max | {spread('metrics_bytes', 'd')} |",
        f"| /metrics series, min … max | {spread('metrics_series', 'd')} |",
        f"| RSS min … max (MiB) | {spread('rss_mib', '.1f')} |",
        f"| RSS, mean of the last quarter − mean of the first | {rss_growth:+.1f} MiB while"
        f" {seen_growth:.0f} more ScaledObjects were seen |",
        f"| after the churn, all expired ({drained.at:.0f} s) | followed {drained.followed:.0f}, /metrics"
        f" {drained.metrics_bytes} bytes / {drained.metrics_series} series, RSS {drained.rss_mib:.1f} MiB |",
        f"| first sample ({samples[0].at:.0f} s, before any call) | followed {samples[0].followed:.0f},"
        f" /metrics {samples[0].metrics_bytes} bytes / {samples[0].metrics_series} series, RSS"
        f" {samples[0].rss_mib:.1f} MiB |",
        "",
        f"The cap: {r['burst']} new ScaledObjects at once (50 in flight) against --max-scaledobjects {r['cap']},"
        f" {r['burst_seconds']:.1f} s:",
        "",
        "| check | result |",
        "|---|---|",
        f"| answers | {dict(sorted(r['burst_codes'].items()))} |",  # type: ignore[attr-defined]
        f"| refused (RESOURCE_EXHAUSTED) | {r['refused']} |",
        f"| followed right after | {at_cap.followed:.0f} (RSS {at_cap.rss_mib:.1f} MiB, /metrics"
        f" {at_cap.metrics_series} series) |",
        f"| a refused one, retried every 2 s | {dict(r['retry_codes'])}; accepted {r['retried_at']:.0f} s after"  # type: ignore[call-overload]
        " the burst |",
        f"| the other refused ones, then | {dict(sorted(r['recovered'].items()))} |",  # type: ignore[attr-defined]
        f"| followed right after the retries (the burst's last ones not yet expired, plus the retried)"
        f" | {after.followed:.0f} |",
    ]
    errors: list[str] = r["server_errors"]  # type: ignore[assignment]
    if errors:
        lines += ["", "Errors in the scaler's log:", "", *(f"    {e}" for e in errors)]
    return "\n".join(lines) + "\n"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=4.0, help="whole run, churn and the cap test after it")
    p.add_argument("--objects", type=int, default=10_000, help="distinct ScaledObjects during the churn")
    p.add_argument("--ttl", type=float, default=20.0, help="--interest-ttl of the scaler, seconds")
    p.add_argument("--cap", type=int, default=2000, help="--max-scaledobjects of the scaler")
    p.add_argument("--output", type=Path, default=ROOT / "docs" / "SOAK.md")
    return p


def main() -> None:
    args = parser().parse_args()
    text = asyncio.run(run(args.minutes, args.objects, args.ttl, args.cap))
    print(text)
    with contextlib.suppress(OSError):
        write_section(args.output, SECTION, text)


if __name__ == "__main__":
    main()
