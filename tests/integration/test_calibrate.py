"""`keda-gpu-scaler calibrate` against a real loopback page whose pod is driven through a load ramp.

The ramp is scripted: each wait between reads moves the test's clock and sets the next page, so the rate
the pod took before requests waited is known exactly (never a sleep for a time, never a timing assert).
"""

from __future__ import annotations

import asyncio

import pytest
from support import ExporterServer

from keda_gpu_scaler import calibrate
from keda_gpu_scaler.cli import main
from keda_gpu_scaler.collect.http import PageFetcher, client_session

STEP = 5.0  # seconds between reads
CAPACITY = 5.0  # requests per second the simulated pod serves


def page(
    finished: float,
    running: float,
    waiting: float,
    prompt: float,
    generated: float,
    itl: tuple[float, float] = (0, 0),
) -> str:
    labels = 'engine="0",model_name="llama"'
    return (
        f"vllm:num_requests_running{{{labels}}} {running}\n"
        f"vllm:num_requests_waiting{{{labels}}} {waiting}\n"
        f'vllm:request_success_total{{{labels},finished_reason="stop"}} {finished}\n'
        f"vllm:prompt_tokens_total{{{labels}}} {prompt}\n"
        f"vllm:generation_tokens_total{{{labels}}} {generated}\n"
        f"vllm:inter_token_latency_seconds_sum{{{labels}}} {itl[0]}\n"
        f"vllm:inter_token_latency_seconds_count{{{labels}}} {itl[1]}\n"
    )


class Ramp:
    """A pod serving CAPACITY requests/s of 1,000 prompt and 200 generated tokens, under a rate that rises
    by 1 request/s every 20 s; past its capacity the rest waits."""

    def __init__(self, server: ExporterServer) -> None:
        self.server = server
        self.now = 0.0
        self.finished = 0.0
        self.waiting = 0.0
        # Inter-token latency: 10 ms, and 4 ms more per request/s of load (seconds summed, tokens counted).
        self.itl = (0.0, 0.0)
        self.server.page = page(0, 4, 0, 0, 0)

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        rate = 1 + self.now // 20
        arrived = rate * seconds
        served = min(self.waiting + arrived, CAPACITY * seconds)
        self.waiting += arrived - served
        self.finished += served
        tokens = served * 200
        self.itl = (self.itl[0] + tokens * (0.010 + 0.004 * rate), self.itl[1] + tokens)
        self.now += seconds
        self.server.page = page(
            self.finished, 4, self.waiting, self.finished * 1000, self.finished * 200, self.itl
        )


async def ramp_run(make_exporter, calibration: calibrate.Calibration):  # type: ignore[no-untyped-def]
    """calibrate.run over a real page server whose load ramps (on the ramp's clock): (ramp, result, lines)."""
    server = await make_exporter()
    ramp = Ramp(server)
    session = client_session()
    fetcher = PageFetcher(session, timeout=3, max_bytes=1 << 20)
    lines: list[str] = []
    try:
        result = await calibrate.run(
            server.url,
            calibration,
            fetch=fetcher.get,
            interval=STEP,
            duration=600,
            out=lines.append,
            clock=ramp.clock,
            sleep=ramp.sleep,
        )
    finally:
        await session.close()
    return ramp, result, lines


async def test_calibrate_prints_the_rate_at_which_requests_start_waiting(make_exporter) -> None:  # type: ignore[no-untyped-def]
    ramp, result, lines = await ramp_run(make_exporter, calibrate.Calibration(window=20, prefill_weight=0.25))
    assert result.saturated
    assert result.best is not None
    assert result.best.requests == pytest.approx(CAPACITY)
    assert result.best.tokens == pytest.approx(CAPACITY * (1000 * 0.25 + 200))
    assert "5.00 requests/s" in lines[-1] and "requests started waiting past it" in lines[-1]
    assert "2250 weighted tokens/s" in lines[-1]
    # It stopped once requests had waited on three pages in a row, not at the end of the duration.
    assert ramp.now < 200
    assert sum("waiting" in line and "req/s" in line for line in lines) >= 10


async def test_calibrate_with_a_latency_target_stops_where_the_time_per_token_passes_it(
    make_exporter,
) -> None:  # type: ignore[no-untyped-def]
    ramp, result, lines = await ramp_run(
        make_exporter, calibrate.Calibration(window=20, per_token_target=0.025)
    )
    # Over 50..70 s: 3 requests/s for 10 s at 22 ms/token and 4 for 10 s at 26 → 24.3 ms, within 25; over
    # 55..75 s the mean is 25.2 ms: the limit, long before any request waits (at 5 requests/s).
    assert result.best is not None
    assert result.best.requests == pytest.approx((10 * 3 + 10 * 4) / 20)
    assert result.best.per_token is not None and result.best.per_token <= 0.025
    assert result.saturated and ramp.now < 100
    assert "ms/token" in lines[5]
    assert "within the latency target" in lines[-1] and "passed 25 ms" in lines[-1]


async def test_calibrate_command_on_a_pod_no_load_reached_suggests_no_threshold_and_fails(
    make_exporter, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    # Requests in flight but a finished counter that never moves: a rate of 0 is no capacity (threshold 0
    # is refused by the scaler itself); it suggested "0" and exited 0.
    server = await make_exporter(page(100, 4, 0, 1000, 200))
    # The command runs its own event loop: in a thread of its own, so that this test's loop serves the page.
    code = await asyncio.to_thread(
        main, ["calibrate", server.url, "--interval", "0.05", "--window", "0.1", "--duration", "0.4"]
    )
    out = capsys.readouterr().out
    assert code == 1, out
    assert "no load reached the pod" in out and "threshold for metric: demand" not in out, out


def test_calibrate_on_a_rate_too_small_to_be_a_threshold_suggests_none() -> None:
    calibration = calibrate.Calibration(window=20)
    for at, finished in ((0.0, 0.0), (10.0, 0.0), (20.0, 0.01)):  # 0.0005 requests/s: 90 % is below 0.001
        assert not isinstance(calibration.observe(at, page(finished, 1, 0, 0, 0).encode()), str)
    assert calibration.best is not None and not calibration.measured
    assert "no load reached the pod" in calibrate.summary(calibration)


def test_a_ramp_that_never_made_requests_wait_is_a_lower_bound_with_a_threshold() -> None:
    calibration = calibrate.Calibration(window=20)
    for at, finished in ((0.0, 0.0), (10.0, 20.0), (20.0, 40.0)):  # 2 requests/s, nothing waiting
        assert not isinstance(calibration.observe(at, page(finished, 1, 0, 0, 0).encode()), str)
    assert calibration.measured and not calibration.saturated
    said = calibrate.summary(calibration)
    assert "lower bound" in said and 'e.g. "1.8" (90 %)' in said, said


def test_calibrate_refuses_a_window_shorter_than_two_reads(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "http://127.0.0.1:9/metrics", "--interval", "5", "--window", "6"]) == 2
    assert (
        "--window=6 is out of range; allowed: seconds, at least two --interval (10)"
        in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("flag", "value", "allowed"),
    [
        ("--interval", "nan", "a finite decimal number"),
        ("--interval", "-3", "0.01 <= --interval <= 300"),
        ("--interval", "0", "0.01 <= --interval <= 300"),
        ("--window", "0.3", "at least two --interval (0.4)"),
        ("--window", "inf", "finite"),
        ("--duration", "nan", "a finite decimal number"),
        ("--duration", "0", "0 < --duration <= 86400"),
        ("--waiting-above", "nan", "a finite decimal number"),
        ("--waiting-above", "-1", "0 <= --waiting-above"),
        ("--sustain", "0", "1-100"),
        ("--sustain", "x", "1-100"),
        ("--prefill-weight", "-7", "0 <= --prefill-weight <= 4"),
        ("--prefill-weight", "nan", "a finite decimal number"),
        ("--per-token-target", "-5", "0 < --per-token-target <= 60000"),
        ("--per-token-target", "1e309", "finite"),
        ("--scrape-timeout", "1e300", "0 < --scrape-timeout <= 300"),
    ],
)
def test_calibrate_refuses_a_bad_number_naming_its_flag_and_value_before_reading(
    capsys: pytest.CaptureFixture[str], flag: str, value: str, allowed: str
) -> None:
    # NaN passed the comparisons (--interval nan read the page in a tight loop) and some flags were not
    # checked at all; the one refusal named neither the flag that failed nor its value.
    short = ["--interval", "0.2", "--window", "0.5", "--duration", "1"]
    assert main(["calibrate", "http://127.0.0.1:9/metrics", *short, flag, value]) == 2
    said = capsys.readouterr()
    assert "reading http" not in said.out
    assert f"{flag}={value} " in said.err and allowed in said.err, said.err


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--engine", "llamacpp"], "--engine: engine llamacpp does not export what metric demand needs"),
        (["--engine", "tgi", "--model", "llama"], "--model: model='llama': engine tgi series carry no model"),
        (["--model", ""], "--model: model='' is not a model name"),
        (["--model", " llama"], "--model: model=' llama' is not a model name"),
    ],
)
def test_calibrate_refuses_what_a_demand_trigger_refuses_before_reading(
    capsys: pytest.CaptureFixture[str], args: list[str], said: str
) -> None:
    # Read for the whole --duration, then "start the ramp lower" (exit 1): it could never be measured.
    short = ["--interval", "0.2", "--window", "0.5", "--duration", "1"]
    assert main(["calibrate", "http://127.0.0.1:9/metrics", *short, *args]) == 2
    out = capsys.readouterr()
    assert "reading http" not in out.out and said in out.err, out.err


@pytest.mark.parametrize("url", ["10.0.3.7:8000/metrics", "http://[fd00::7:8000/metrics", "ftp://h/m"])
def test_calibrate_refuses_a_url_it_could_never_read_before_reading(
    capsys: pytest.CaptureFixture[str], url: str
) -> None:
    # Without http:// it read "page not read" at every interval for the whole --duration, then advised
    # a longer ramp.
    assert main(["calibrate", url, "--interval", "0.2", "--window", "0.5", "--duration", "1"]) == 2
    said = capsys.readouterr()
    assert "reading http" not in said.out and f"URL {url!r} is not an http(s) URL" in said.err, said.err


def test_a_page_without_a_finished_counter_is_said_not_rated() -> None:
    calibration = calibrate.Calibration(window=20)
    why = calibration.observe(0, b"llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\n")
    assert isinstance(why, str) and "finished requests" in why
    assert calibration.best is None


def test_a_latency_target_on_a_page_without_a_latency_histogram_names_the_missing_family() -> None:
    calibration = calibrate.Calibration(window=20, per_token_target=0.025)
    for at, finished in ((0.0, 0), (10.0, 30), (20.0, 60)):
        whole = page(finished, 3, 0, finished * 1000, finished * 200)
        without = "".join(f"{line}\n" for line in whole.splitlines() if "inter_token" not in line)
        assert not isinstance(calibration.observe(at, without.encode()), str)
    said = calibrate.summary(calibration)
    assert "vllm:inter_token_latency_seconds" in said and "--per-token-target" in said, said
    assert "start the ramp lower" not in said, said


async def test_calibrate_ends_at_its_duration_not_an_interval_after() -> None:
    # --duration 1 --interval 20: one read at 0 s, then it slept 20 s before it saw the duration over.
    now, reads = 0.0, []

    async def fetch(url: str) -> bytes:
        reads.append(now)
        return b'vllm:num_requests_running{engine="0"} 1\n'

    async def sleep(seconds: float) -> None:
        nonlocal now
        now += seconds

    def clock() -> float:
        return now

    for duration, expected in ((1, [0.0]), (60, [0.0, 20.0, 40.0, 60.0])):
        now, reads = 0.0, []
        await calibrate.run(
            "http://pod/metrics", calibrate.Calibration(window=40), fetch=fetch, interval=20,
            duration=duration, out=lambda _: None, clock=clock, sleep=sleep,
        )  # fmt: skip
        assert (reads, now) == (expected, expected[-1])
