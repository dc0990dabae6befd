"""The exporter scrape path against real loopback HTTP servers: limits, refusals, backoff, supervision."""

from __future__ import annotations

import asyncio
import gzip
import ssl
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from certs import CertificateAuthority, write
from support import GpuLine, dcgm_page, eventually

from keda_gpu_scaler.collect import backoff, http, scrape
from keda_gpu_scaler.collect.backoff import backoff_delay
from keda_gpu_scaler.collect.http import BearerToken, PageFetcher, client_session, exporter_ssl
from keda_gpu_scaler.collect.interest import SCRAPE_INTEREST
from keda_gpu_scaler.collect.scrape import GPU_EXPORTER_PAGES, PageReader, ScrapeCollector, ScrapeLimits
from keda_gpu_scaler.collect.store import Store
from keda_gpu_scaler.collect.wanted import WantedSources
from keda_gpu_scaler.pages import exposition
from keda_gpu_scaler.telemetry import Telemetry

PAGE = dcgm_page([GpuLine("llm", "vllm-0", 30), GpuLine("llm", "vllm-1", 40, gpu=1)])
# A gzip page cut inside its stream: the part that inflates still reads as a valid, shorter page.
TRUNCATED_GZIP = gzip.compress(PAGE.encode())[:-12]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Server:
    """A loopback HTTP(S) server; each path answers with its handler."""

    def __init__(self) -> None:
        self.port = 0
        self.runner: web.AppRunner | None = None
        self.seen_headers: list[dict[str, str]] = []
        self.scheme = "http"
        self.host = "127.0.0.1"

    def url(self, path: str = "/metrics") -> str:
        return f"{self.scheme}://{self.host}:{self.port}{path}"

    async def start(self, routes: dict[str, Handler], ssl_context: ssl.SSLContext | None = None) -> None:
        app = web.Application()
        for path, handler in routes.items():

            async def recorded(request: web.Request, handler: Handler = handler) -> web.StreamResponse:
                self.seen_headers.append(dict(request.headers))
                return await handler(request)

            app.router.add_get(path, recorded)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=ssl_context).start()
        self.port = self.runner.addresses[0][1]
        if ssl_context is not None:
            self.scheme, self.host = "https", "localhost"


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Awaitable[Server]]]:
    servers: list[Server] = []

    async def start(routes: dict[str, Handler], ssl_context: ssl.SSLContext | None = None) -> Server:
        server = Server()
        await server.start(routes, ssl_context)
        servers.append(server)
        return server

    yield start
    for server in servers:
        assert server.runner is not None
        await server.runner.cleanup()


def text(body: str | bytes, **headers: str) -> Handler:
    async def handler(_: web.Request) -> web.StreamResponse:
        data = body.encode() if isinstance(body, str) else body
        return web.Response(body=data, headers={"Content-Type": "text/plain", **headers})

    return handler


# The HTTP session of the test running (the app's one session, in the product).
_SESSION: list[aiohttp.ClientSession] = []


@pytest.fixture(autouse=True)
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with client_session() as made:
        _SESSION.append(made)
        try:
            yield made
        finally:
            _SESSION.remove(made)


def page_fetcher(timeout: float = 2.0, max_bytes: int = 1 << 20, **kwargs: object) -> PageFetcher:
    return PageFetcher(_SESSION[-1], timeout=timeout, max_bytes=max_bytes, **kwargs)  # type: ignore[arg-type]


class Rig:
    """A ScrapeCollector with its store, wanted from the start."""

    def __init__(self, *, max_bytes: int = 1 << 20, **kwargs: object) -> None:
        self.store = Store()
        self.interest = WantedSources()
        self.interest.want("test", [SCRAPE_INTEREST])
        self.limits = ScrapeLimits(interval=0.05, timeout=2.0, max_page_bytes=max_bytes, concurrency=4)
        fetcher = kwargs.pop("fetcher", None)
        if fetcher is None:
            fetcher = page_fetcher(timeout=self.limits.timeout, max_bytes=max_bytes)
        self.collector = ScrapeCollector(
            fetcher=fetcher,  # type: ignore[arg-type]
            store=self.store,
            interest=self.interest,
            limits=self.limits,
            telemetry=Telemetry(),
            clock=time.monotonic,
            **kwargs,  # type: ignore[arg-type]
        )

    def error(self, url: str) -> str | None:
        (state,) = [s for s in self.store.sources() if s.source == url]
        return state.last_error

    def pods(self, url: str) -> set[str]:
        (state,) = [s for s in self.store.sources() if s.source == url]
        assert state.last_page is not None
        return {r.pod for rs in state.last_page.by_namespace.values() for r in rs}


async def test_a_healthy_page_is_read(serve) -> None:  # type: ignore[no-untyped-def]
    server = await serve({"/metrics": text(PAGE)})
    rig = Rig()
    assert await rig.collector.scrape_once(server.url())
    assert rig.pods(server.url()) == {"vllm-0", "vllm-1"}


# ---- issue 15 item 2: the size cap counts decompressed bytes ---------------------------------------


async def test_gzip_bomb_is_refused_at_the_decompressed_cap(serve) -> None:  # type: ignore[no-untyped-def]
    # 64 MiB of comment lines compress to ~64 kB: Content-Length says 64 kB, the page is 1,000 times that.
    bomb = gzip.compress((b"# " + b"x" * 1021 + b"\n") * 65536, compresslevel=9)
    assert len(bomb) < 1 << 20
    server = await serve({"/metrics": text(bomb, **{"Content-Encoding": "gzip"})})
    rig = Rig(max_bytes=1 << 20)
    assert not await rig.collector.scrape_once(server.url())
    error = rig.error(server.url())
    assert error is not None and "limit of 1048576 bytes" in error, error


async def test_a_gzip_page_within_the_cap_is_read(serve) -> None:  # type: ignore[no-untyped-def]
    server = await serve({"/metrics": text(gzip.compress(PAGE.encode()), **{"Content-Encoding": "gzip"})})
    rig = Rig()
    assert await rig.collector.scrape_once(server.url())
    assert rig.pods(server.url()) == {"vllm-0", "vllm-1"}


async def test_a_gzip_page_is_inflated_off_the_loop(serve, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # A gzip bomb inflated to the cap on the loop held every RPC for tens of ms on each retry.
    threads: list[str] = []
    real = http.inflate

    def recording(data: bytes, encoding: str, max_bytes: int, deadline: float) -> bytes:
        threads.append(threading.current_thread().name)
        return real(data, encoding, max_bytes, deadline)

    monkeypatch.setattr(http, "inflate", recording)
    bomb = gzip.compress(b"# padding\n" * (2 << 20), compresslevel=9)
    server = await serve(
        {
            "/metrics": text(gzip.compress(PAGE.encode()), **{"Content-Encoding": "gzip"}),
            "/bomb": text(bomb, **{"Content-Encoding": "gzip"}),
        }
    )
    rig = Rig()
    assert await rig.collector.scrape_once(server.url())
    assert not await rig.collector.scrape_once(server.url("/bomb"))
    assert "limit of 1048576 bytes" in (rig.error(server.url("/bomb")) or "")
    assert len(threads) == 2 and threading.main_thread().name not in threads


# ---- issue 15 item 6: redirects are refused ----------------------------------------------------------


async def test_a_redirect_is_a_failed_scrape_naming_the_location(serve) -> None:  # type: ignore[no-untyped-def]
    elsewhere = await serve({"/metrics": text(PAGE)})

    async def redirect(_: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(elsewhere.url())

    server = await serve({"/metrics": redirect})
    rig = Rig()
    assert not await rig.collector.scrape_once(server.url())
    error = rig.error(server.url())
    assert error is not None and "302" in error and elsewhere.url() in error and "refused" in error, error
    assert not elsewhere.seen_headers, "the redirect must not be followed"


# ---- issue 12 item 6: a page with no GPU exporter family is a failure, not an empty fleet ------------


@pytest.mark.parametrize(
    "body",
    [
        "# HELP keda_gpu_scaler_rpcs_total RPCs.\n# TYPE keda_gpu_scaler_rpcs_total counter\nkeda_gpu_scaler_rpcs_total 3\n",
        "",
        "# HELP up up\n",
        "{}\n",
    ],
    ids=["another exporter", "empty", "comments only", "json"],
)
async def test_a_page_without_gpu_exporter_metrics_is_a_failed_source(serve, body: str) -> None:  # type: ignore[no-untyped-def]
    server = await serve({"/metrics": text(body)})
    rig = Rig()
    assert not await rig.collector.scrape_once(server.url())
    error = rig.error(server.url())
    assert error is not None and "no GPU exporter metrics on this page" in error, error


async def test_which_families_make_a_page_valid_is_a_parameter(serve) -> None:  # type: ignore[no-untyped-def]
    queue = "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 2\n"
    server = await serve({"/metrics": text(queue)})
    names = frozenset({"vllm:num_requests_waiting"})
    reader = PageReader(names, lambda samples: [], names, "inference server metrics")
    assert await Rig(reader=reader).collector.scrape_once(server.url())
    # The same page read for GPU metrics is not one of ours; and a GPU page is not an inference page.
    assert not await Rig().collector.scrape_once(server.url())
    gpu = await serve({"/metrics": text(PAGE)})
    rig = Rig(reader=reader)
    assert not await rig.collector.scrape_once(gpu.url())
    assert rig.error(gpu.url()) == "no inference server metrics on this page"


# ---- issue 15 item 8: conflicting duplicate series -------------------------------------------------


async def test_conflicting_duplicate_series_fail_the_page(serve) -> None:  # type: ignore[no-untyped-def]
    one = dcgm_page([GpuLine("llm", "vllm-0", 30)])
    other = dcgm_page([GpuLine("llm", "vllm-0", 90)])
    server = await serve({"/metrics": text(one + other)})
    rig = Rig()
    assert not await rig.collector.scrape_once(server.url())
    error = rig.error(server.url())
    assert error is not None and "DCGM_FI_DEV_GPU_UTIL" in error and "30" in error and "90" in error, error


async def test_identical_duplicate_series_are_read_once(serve) -> None:  # type: ignore[no-untyped-def]
    server = await serve({"/metrics": text(PAGE + PAGE)})
    rig = Rig()
    assert await rig.collector.scrape_once(server.url())


# ---- issue 15 item 3: what one page may contribute, and big pages off the loop ---------------------


async def test_more_series_than_the_limit_fail_the_page(serve, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(scrape, "MAX_SERIES_PER_PAGE", 5)
    server = await serve({"/metrics": text(PAGE)})  # 2 GPUs x 3 families = 6 series
    rig = Rig()
    assert not await rig.collector.scrape_once(server.url())
    error = rig.error(server.url())
    assert error is not None and "more than 5 series" in error, error


async def test_a_large_page_over_the_series_limit_is_refused_unparsed_and_the_exporter_spared(
    serve, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(scrape, "MAX_SERIES_PER_PAGE", 5)
    monkeypatch.setattr(scrape, "PARSE_OFF_LOOP_BYTES", 100)  # every page here is a large one
    parsed: list[bytes] = []
    searched: list[bytes] = []
    real_read, real_search = scrape.read_page, exposition.too_many_samples

    def reading(body, reader):  # type: ignore[no-untyped-def]
        parsed.append(body)
        return real_read(body, reader)

    def searching(page, names, limit):  # type: ignore[no-untyped-def]
        searched.append(page)
        return real_search(page, names, limit)

    monkeypatch.setattr(scrape, "read_page", reading)
    monkeypatch.setattr(exposition, "too_many_samples", searching)
    current = {"page": PAGE}  # 2 GPUs x 3 families = 6 series

    async def handler(_: web.Request) -> web.StreamResponse:
        return web.Response(text=current["page"], content_type="text/plain")

    server = await serve({"/metrics": handler})
    rig = Rig()
    for _ in range(3):
        assert not await rig.collector.scrape_once(server.url())
        error = rig.error(server.url())
        assert error is not None and "more than 5 series" in error, error
    assert not parsed, "a page over the limit is refused before it is parsed"
    assert len(searched) == 1, "the same page again is refused by its digest, not searched again"
    interval = rig.limits.interval
    assert rig.collector.retry_delay(1, refused=True) == backoff.MAX_BACKOFF_INTERVALS * interval
    assert rig.collector.retry_delay(1) == interval

    current["page"] = dcgm_page([GpuLine("llm", "vllm-0", 30)]) + "# padding\n" * 20  # 3 series
    assert await rig.collector.scrape_once(server.url())
    assert rig.pods(server.url()) == {"vllm-0"} and len(parsed) == 1


def test_counting_a_pages_series_refuses_it_where_the_parser_would() -> None:
    names = frozenset({"DCGM_FI_DEV_GPU_UTIL"})
    page = (
        b"DCGM_FI_DEV_GPU_UTIL 1\n"
        b'  DCGM_FI_DEV_GPU_UTIL{gpu="1"} 2\n'
        b"DCGM_FI_DEV_GPU_UTILX 3\n"
        b"# DCGM_FI_DEV_GPU_UTIL 3\n"
        b"DCGM_FI_DEV_GPU_UTIL 4\n"
    )
    for limit in range(4):
        counted = exposition.too_many_samples(page, names, limit)
        try:
            exposition.parse_exposition(page, names, max_samples=limit)
            parsed = None
        except exposition.ExpositionError as error:
            parsed = str(error)
        assert (counted and str(counted)) == parsed


def test_a_page_far_larger_than_a_real_nodes_is_read_and_a_hostile_one_is_refused() -> None:
    """A real node's page has about 40 wanted series (8 GPUs): one of 2,000 GPUs is still read whole; the
    150,000 series a hostile exporter served are refused, naming the limit, at the default limit."""
    large = "".join(
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i}",namespace="llm",pod="p-{i}"}} 1\n' for i in range(2_000)
    )
    assert len(scrape.read_page(large.encode(), GPU_EXPORTER_PAGES)["llm"]) == 2_000
    hostile = "".join(
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i}",namespace="llm",pod="p-{i}"}} 1\n' for i in range(150_000)
    )
    with pytest.raises(exposition.ExpositionError, match=r"more than [\d,]+ series"):
        scrape.read_page(hostile.encode(), GPU_EXPORTER_PAGES)


def parsing_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the thread each page is parsed in, from now on."""
    threads: list[str] = []
    real = scrape.read_page

    def recording(body, reader):  # type: ignore[no-untyped-def]
        threads.append(threading.current_thread().name)
        return real(body, reader)

    monkeypatch.setattr(scrape, "read_page", recording)
    return threads


async def test_a_large_page_is_parsed_in_a_worker_thread(serve, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    threads = parsing_threads(monkeypatch)
    big = PAGE + "# padding\n" * (scrape.PARSE_OFF_LOOP_BYTES // 10 + 1)
    server = await serve({"/metrics": text(PAGE), "/big": text(big)})
    rig = Rig()
    assert await rig.collector.scrape_once(server.url())
    assert await rig.collector.scrape_once(server.url("/big"))
    main = threading.main_thread().name
    assert threads[0] == main, "a small page is parsed on the loop"
    assert threads[1] != main, "a large page is parsed off the loop"
    assert rig.pods(server.url("/big")) == {"vllm-0", "vllm-1"}


async def test_a_page_of_many_short_series_is_parsed_in_a_worker_thread(serve, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # 6,000 short lines of a wanted family in under 256 kB: about 80 ms of parsing, which on the loop held
    # every tenant's RPCs (a dozen such pods of one tenant: over a second).
    threads = parsing_threads(monkeypatch)
    short = PAGE + "".join(f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i}"}} 1\n' for i in range(2, 6_000))
    assert len(short) < 256 * 1024
    server = await serve({"/metrics": text(short)})
    rig = Rig()
    await rig.collector.scrape_once(server.url())
    assert threads and threads[0] != threading.main_thread().name, "a costly page is parsed off the loop"


# ---- issue 12 item 1 and issue 15 item 9: backoff capped, loops supervised --------------------------


def test_backoff_after_2000_failures_is_capped_at_three_intervals() -> None:
    rig = Rig()
    interval = rig.limits.interval
    assert rig.collector.retry_delay(0) == interval
    assert rig.collector.retry_delay(1) == interval
    assert rig.collector.retry_delay(2) == 2 * interval
    assert rig.collector.retry_delay(2000) == 3 * interval
    assert rig.collector.retry_delay(10**9) == 3 * interval
    assert backoff_delay(2000, first=5.0, cap=15.0) == 15.0


async def test_a_scrape_loop_that_raises_is_restarted(serve, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    server = await serve({"/metrics": text(PAGE)})
    rig = Rig()
    calls: list[int] = []
    real = rig.collector.scrape_once

    async def buggy_once(url: str) -> bool:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug in a reader")
        return await real(url)

    monkeypatch.setattr(rig.collector, "scrape_once", buggy_once)
    rig.collector.add(server.url())
    try:

        async def failed_saying_why() -> None:
            assert rig.error(server.url()) == "its scrape failed: RuntimeError: a bug in a reader (restarted)"

        await eventually(failed_saying_why)

        async def scraped_after_the_bug() -> None:
            assert len(calls) >= 2
            assert rig.pods(server.url()) == {"vllm-0", "vllm-1"}

        await eventually(scraped_after_the_bug)
    finally:
        await rig.collector.stop()


# ---- HTTPS exporters behind kube-rbac-proxy: bearer token and CA -----------------------------------


async def test_https_exporter_with_bearer_token_read_again_when_it_changes(serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ca = CertificateAuthority()
    cert, key = write(tmp_path, "exporter", ca.issue("localhost", ["localhost"]))
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(ca.cert_pem)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)

    async def guarded(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") not in ("Bearer first", "Bearer second"):
            return web.Response(status=401, reason="Unauthorized")
        return web.Response(text=PAGE)

    server = await serve({"/metrics": guarded}, ssl_context=server_tls)
    token = tmp_path / "token"
    token.write_text("first\n")

    def fetcher(ca: Path | None) -> PageFetcher:
        return page_fetcher(ssl_context=exporter_ssl(ca), token=BearerToken(token))

    rig = Rig(fetcher=fetcher(ca_file))
    assert await rig.collector.scrape_once(server.url())
    token.write_text("second-but-longer\n")
    assert not await rig.collector.scrape_once(server.url())
    assert "HTTP 401" in (rig.error(server.url()) or "")
    token.write_text("second\n")
    assert await rig.collector.scrape_once(server.url())
    assert [h.get("Authorization") for h in server.seen_headers] == [
        "Bearer first",
        "Bearer second-but-longer",
        "Bearer second",
    ]
    # Without the CA the exporter's certificate is not trusted.
    rig = Rig(fetcher=fetcher(None))
    assert not await rig.collector.scrape_once(server.url())
    assert "certificate" in (rig.error(server.url()) or "").lower()


async def test_the_token_is_never_sent_over_plain_http(serve, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server = await serve({"/metrics": text(PAGE)})
    token = tmp_path / "token"
    token.write_text("secret")
    rig = Rig(fetcher=page_fetcher(token=BearerToken(token)))
    assert await rig.collector.scrape_once(server.url())
    assert "Authorization" not in server.seen_headers[0]


async def test_a_missing_token_file_is_a_failed_scrape_naming_the_flag() -> None:
    rig = Rig(fetcher=page_fetcher(token=BearerToken(Path("/nonexistent/token"))))
    assert not await rig.collector.scrape_once("https://localhost:1/metrics")
    assert "--exporter-bearer-token-file" in (rig.error("https://localhost:1/metrics") or "")


def test_the_default_reader_reads_gpu_exporter_pages() -> None:
    assert GPU_EXPORTER_PAGES.what == "GPU exporter metrics"
    assert "DCGM_FI_DEV_GPU_UTIL" in GPU_EXPORTER_PAGES.valid_names


async def test_a_failure_is_logged_once_per_outage_and_the_recovery_once(serve, caplog) -> None:  # type: ignore[no-untyped-def]
    import logging

    current = {"page": PAGE}

    async def handler(_: web.Request) -> web.StreamResponse:
        return web.Response(text=current["page"], content_type="text/plain")

    server = await serve({"/metrics": handler})
    rig = Rig()
    caplog.set_level(logging.INFO, logger="keda_gpu_scaler.collect.scrape")
    assert await rig.collector.scrape_once(server.url())
    current["page"] = "up 1\n"  # a page without any GPU exporter family: a failed scrape
    for _ in range(5):
        assert not await rig.collector.scrape_once(server.url())
    current["page"] = PAGE
    assert await rig.collector.scrape_once(server.url())
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert sum("failed" in m for m in messages) == 1, messages
    assert sum("answers again" in m for m in messages) == 1, messages


@pytest.mark.parametrize("interval", [0.05, 1.0, 5.0, 30.0])
@pytest.mark.parametrize("when", [0.0, 0.001, 12.3456, 1_000_000.987654])
def test_a_wake_up_slot_is_never_later_than_drawn_and_at_most_one_slot_earlier(
    interval: float, when: float
) -> None:
    slot = interval / scrape.SLOTS_PER_INTERVAL
    wake = scrape.wake_slot(when, interval)
    assert wake <= when < wake + slot + 1e-9
    # Every draw inside one slot wakes at the same instant: those scrapes share a turn of the loop.
    assert scrape.wake_slot(wake + 0.4 * slot, interval) == wake


async def test_sleep_until_wakes_at_the_loop_time_given_and_at_once_for_a_past_one() -> None:
    loop = asyncio.get_running_loop()
    target = loop.time() + 0.05
    await scrape.sleep_until(target)
    assert loop.time() >= target
    started = loop.time()
    await scrape.sleep_until(started - 10)
    assert loop.time() - started < 1.0


async def test_sleep_until_cancelled_leaves_no_timer_behind() -> None:
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(scrape.sleep_until(loop.time() + 3600))
    await asyncio.sleep(0)
    before = len(loop._scheduled)  # type: ignore[attr-defined]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len([h for h in loop._scheduled if not h.cancelled()]) < before  # type: ignore[attr-defined]


def test_a_page_reader_reads_from_its_samples_or_its_body_never_both_or_neither() -> None:
    names = frozenset({"x"})
    with pytest.raises(ValueError, match="either from its samples or from its body"):
        PageReader(names, None, names, "nothing")
    with pytest.raises(ValueError, match="either from its samples or from its body"):
        PageReader(names, lambda samples: [], names, "both", read_body=lambda body, samples: [])


async def test_a_task_failing_the_same_way_at_every_restart_logs_its_traceback_once(  # type: ignore[no-untyped-def]
    monkeypatch, caplog
) -> None:
    # Every restart logged a traceback (1 s, 2 s … then every 30 s) for as long as the bug lasted: said
    # once per outage, as a failing scrape is; a new reason is said again.
    import logging

    from keda_gpu_scaler.collect import supervise

    monkeypatch.setattr(supervise, "backoff_delay", lambda *args, **kwargs: 0.001)
    runs: list[int] = []

    async def buggy() -> None:
        runs.append(1)
        raise RuntimeError("a bug in a reader" if len(runs) < 20 else "another bug")

    caplog.set_level(logging.DEBUG, logger=supervise.__name__)
    task = supervise.supervised(buggy, "scrape of http://a/metrics")
    try:

        async def restarted_often() -> None:
            assert len(runs) >= 30

        await eventually(restarted_often)
    finally:
        await supervise.cancel_all([task])
    said = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage().split("failed: ")[1].split(";")[0] for r in said] == [
        "RuntimeError: a bug in a reader",
        "RuntimeError: another bug",
    ]
    assert all(r.exc_info for r in said)
