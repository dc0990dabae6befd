"""Command line: `serve` (the main job), `demo` (serve + a simulated GPU and LLM fleet), `explain` (one-shot)
and `calibrate` (what one LLM-serving replica serves, for `metric: demand`'s threshold)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Sequence

from keda_gpu_scaler import __version__
from keda_gpu_scaler.config.flags import FLAGS
from keda_gpu_scaler.config.settings import (
    Settings,
    SettingsError,
    build_settings,
    env_values,
    resolve_kubernetes,
)
from keda_gpu_scaler.core.names import is_http_url
from keda_gpu_scaler.core.recommended import llm_summary
from keda_gpu_scaler.server.logs import configure_logging

log = logging.getLogger("keda_gpu_scaler")

DESCRIPTION = f"""\
KEDA external scaler that scales GPU workloads on their own pods' GPU utilisation or memory, and LLM servers on the work arriving at their own pods (`demand`), with requests in flight, queue or KV-cache as guards and the inference gateway's queue (`pending`) as the wake from zero.
{llm_summary()} (thresholds: measure yours with `calibrate`).

  keda-gpu-scaler serve --exporter-url http://node-a:9400/metrics   the main job (KEDA calls it on :6000)
  keda-gpu-scaler demo                                             try it: a simulated GPU and LLM fleet on loopback
  keda-gpu-scaler explain --exporter-url URL --namespace NS podNamePrefix=vllm- threshold=70
  keda-gpu-scaler calibrate http://10.0.3.7:8000/metrics            one pod's capacity under a load ramp
"""


def _add_serve_flags(parser: argparse.ArgumentParser) -> None:
    for flag in FLAGS:
        default_text = f" (default: {flag.default})" if flag.default else ""
        parser.add_argument(
            flag.name,
            dest=flag.dest,
            action="append" if flag.repeatable else "store",
            choices=flag.choices,
            metavar=None if flag.choices else flag.dest.split("_")[-1].upper(),
            help=f"{flag.help}{default_text}; env {flag.env}",
        )


# explain's two reads of a page for a rate: at most the longest window apart (metric=demand's).
MAX_RATE_INTERVAL = 600.0


def add_demo_arguments(demo: argparse.ArgumentParser) -> None:
    """The demo's flags (the table of them in docs/reference.md is made from these)."""
    demo.add_argument("--grpc-address", default="127.0.0.1:6000", help="gRPC address (KEDA's side)")
    demo.add_argument("--http-address", default="127.0.0.1:8080", help="HTTP address: /metrics, /explain")
    demo.add_argument(
        "--control-port",
        type=int,
        default=8081,
        help="port of the fleet's control server on 127.0.0.1: /load, /pods/POD/metrics, /",
    )
    demo.add_argument("--scrape-interval", default="2", help="seconds between scrapes")
    demo.add_argument(
        "--watch-interval", type=float, default=5.0, help="seconds between status lines (0: off)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="keda-gpu-scaler", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="{serve,demo,explain,calibrate}")

    serve = commands.add_parser("serve", help="run the external scaler (the main job)")
    _add_serve_flags(serve)

    demo = commands.add_parser(
        "demo",
        help="run the scaler with a simulated GPU and LLM-serving fleet on loopback",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_demo_arguments(demo)

    explain = commands.add_parser("explain", help="scrape once and print what the scaler sees for a target")
    explain.add_argument("--exporter-url", action="append", help="exporter endpoint; repeatable")
    explain.add_argument(
        "--inference-url",
        action="append",
        metavar="NAMESPACE/POD=URL",
        help="an inference server's metrics page and its pod (for metric=requests|queue|kv_cache); repeatable",
    )
    explain.add_argument(
        "--gateway-url",
        action="append",
        metavar="NAMESPACE/POOL=URL",
        help="an endpoint picker's metrics page and its InferencePool (for metric=pending); repeatable",
    )
    explain.add_argument("--namespace", required=True, help="the ScaledObject's namespace")
    explain.add_argument("--name", default="explain", help="a ScaledObject name to show (default: explain)")
    explain.add_argument("--scrape-timeout", default="3", help="seconds per scrape (default: 3)")
    explain.add_argument(
        "--rate-interval",
        default="2",
        help="seconds between the two reads of each page that a rate (metric=demand) needs"
        f" (0 < --rate-interval <= {MAX_RATE_INTERVAL:g}; default: 2)",
    )
    explain.add_argument("--json", action="store_true", help="print JSON instead of a table")
    explain.add_argument(
        "metadata", nargs="*", metavar="KEY=VALUE", help="trigger metadata, e.g. threshold=70"
    )
    explain.add_argument(
        "--trigger",
        action="append",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="another trigger of the same ScaledObject, after the first one's metadata; repeatable:"
        " each is shown from the same scrape",
    )
    add_calibrate_arguments(
        commands.add_parser(
            "calibrate",
            help="read one inference pod's page during a load ramp and print the rate at which requests"
            " start waiting (the threshold of metric: demand)",
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        )
    )
    return parser


# calibrate's ranges: a read at most every 10 ms (a tight loop on the pod's page is no measurement), at
# least every 5 minutes (two reads fit in the longest window); a day of ramp at most.
CALIBRATE_INTERVAL = (0.01, 300.0)
CALIBRATE_MAX_DURATION = 86400.0
CALIBRATE_MAX_WAITING = 100000.0
CALIBRATE_MAX_SUSTAIN = 100
CALIBRATE_MAX_PER_TOKEN_MS = 60000.0
CALIBRATE_MAX_SCRAPE_TIMEOUT = 300.0


def add_calibrate_arguments(calibrate: argparse.ArgumentParser) -> None:
    from keda_gpu_scaler.core.demand import DEFAULT_PREFILL_WEIGHT, DEFAULT_WINDOW_SECONDS, MAX_WINDOW_SECONDS
    from keda_gpu_scaler.pages.engines import ENGINE_CHOICES

    # The numbers are read as text and checked in _calibrate: each refusal names its flag and value.
    low, high = CALIBRATE_INTERVAL
    calibrate.add_argument(
        "url", help="the pod's inference-server metrics page, e.g. http://10.0.3.7:8000/metrics"
    )
    calibrate.add_argument(
        "--interval", default="5", help=f"seconds between reads of the page ({low:g}-{high:g})"
    )
    calibrate.add_argument(
        "--window",
        default=f"{DEFAULT_WINDOW_SECONDS:g}",
        help=f"seconds each rate is taken over (two intervals at least, {MAX_WINDOW_SECONDS:g} at most)",
    )
    calibrate.add_argument(
        "--duration", default="1800", help=f"seconds to read at most (at most {CALIBRATE_MAX_DURATION:g})"
    )
    calibrate.add_argument(
        "--waiting-above", default="0", help='more requests waiting than this is "requests wait"'
    )
    calibrate.add_argument(
        "--sustain",
        default="3",
        help=f"pages in a row with requests waiting that end the ramp (1-{CALIBRATE_MAX_SUSTAIN})",
    )
    calibrate.add_argument("--engine", choices=ENGINE_CHOICES, default="auto", help="how the page is read")
    calibrate.add_argument("--model", default=None, help="only series of this model")
    calibrate.add_argument(
        "--prefill-weight",
        default=f"{DEFAULT_PREFILL_WEIGHT:g}",
        help="what a prompt token weighs against a generated one (demandUnit: tokens; 0-4)",
    )
    calibrate.add_argument(
        "--per-token-target",
        default=None,
        metavar="MS",
        help="milliseconds per output token not to pass (the engine's inter-token latency histogram);"
        " without it, the limit is requests waiting",
    )
    calibrate.add_argument("--scrape-timeout", default="3", help="seconds per read of the page")


def _version() -> str:
    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "demo":
            return _demo(args)
        if args.command == "calibrate":
            return _calibrate(args)
        return _explain(args)
    except SettingsError as error:
        print(f"keda-gpu-scaler: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # `keda-gpu-scaler explain --json | head`: the reader left; that is not an error worth a traceback.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _serve(args: argparse.Namespace) -> int:
    from keda_gpu_scaler.app import App, run_until_signalled
    from keda_gpu_scaler.collect.prometheus_sources import sample_window

    values = env_values()
    given = {flag.dest: v for flag in FLAGS if (v := getattr(args, flag.dest)) is not None}
    values.update(given)
    try:
        settings = build_settings(values)
    except SettingsError as error:
        # Name the environment variable when the bad value came from there, not from a flag.
        culprit = next(
            (
                f
                for f in FLAGS
                if str(error).startswith(f.name) and f.dest not in given and f.env in os.environ
            ),
            None,
        )
        raise SettingsError(f"{error} (from {culprit.env})" if culprit else str(error)) from None
    configure_logging(settings.log_level, settings.log_format)
    settings = resolve_kubernetes(settings, os.environ)
    log.info(
        "Kubernetes discovery %s",
        f"on ({settings.kubeconfig or 'in-cluster service account'})"
        if settings.kubernetes == "on"
        else "off",
    )
    if settings.prometheus_url:
        log.info(
            "Prometheus source: %s (default source for triggers: %s); samples older than %gs when"
            " queried are not used: --prometheus-max-staleness must exceed Prometheus' scrape interval"
            " plus --scrape-interval",
            settings.prometheus_url,
            settings.default_source,
            sample_window(settings.prometheus_max_staleness, settings.scrape_interval),
        )
    if settings.kubernetes == "off":
        _log_unconfigured(settings)
    asyncio.run(run_until_signalled(App(settings)))
    return 0


def unconfigured_sources(settings: Settings) -> list[tuple[str, str]]:
    """Without Kubernetes, the flags naming pages that were not given, each with the triggers that then
    answer UNAVAILABLE. Triggers whose default source is Prometheus need no page of their own."""
    missing: list[tuple[str, str]] = []
    if settings.default_source == "scrape":
        if not settings.exporter_urls:
            missing.append(("--exporter-url", "utilization, memory"))
        if not settings.inference_urls:
            missing.append(("--inference-url", "requests, queue, kv_cache"))
    # `pending` reads the endpoint pickers' pages whatever --default-source says.
    if not settings.gateway_urls:
        missing.append(("--gateway-url", "pending"))
    return missing


def _log_unconfigured(settings: Settings) -> None:
    missing = unconfigured_sources(settings)
    if not missing:
        return
    flags = " or ".join(flag for flag, _ in missing)
    if len(missing) == 3 and not settings.prometheus_url:
        log.warning("no %s given: every call will answer UNAVAILABLE until one is configured", flags)
        return
    # Some sources are given: name only what is not, and which triggers it leaves without data.
    metrics = ", ".join(metrics for _, metrics in missing)
    unless = " unless they say source: prometheus" if settings.prometheus_url else ""
    log.info("no %s given: triggers with metric %s answer UNAVAILABLE%s", flags, metrics, unless)


def _demo(args: argparse.Namespace) -> int:
    try:
        from keda_gpu_scaler.demo.runner import run_demo
    except ModuleNotFoundError as error:
        if not (error.name or "").startswith("keda_gpu_scaler.demo"):
            raise
        # The container image leaves the demo out (.dockerignore): say so, not a traceback.
        raise SettingsError(
            "the demo is not in this installation (the container image leaves it out): run it from the"
            " package installed with pip, or from a checkout with `make run`"
        ) from None

    if not 0 <= args.control_port <= 65535:
        raise SettingsError(
            f"--control-port={args.control_port} is out of range; allowed: 0 to 65535 (0: any)"
        )
    configure_logging("info", "text")
    settings = build_settings(
        {
            "grpc_address": args.grpc_address,
            "http_address": args.http_address,
            "scrape_interval": args.scrape_interval,
            "kubernetes": "off",
        }
    )
    asyncio.run(run_demo(settings, control_port=args.control_port, watch_interval=args.watch_interval))
    return 0


def _explain(args: argparse.Namespace) -> int:
    from keda_gpu_scaler.explain import explain_once, render_table

    configure_logging("warning", "text")
    triggers = [_metadata(items) for items in ([args.metadata] if args.metadata else []) + args.trigger]
    if not triggers:
        raise SettingsError("explain needs a trigger's metadata, e.g. threshold=70 podNamePrefix=vllm-")
    if not args.exporter_url and not args.inference_url and not args.gateway_url:
        raise SettingsError(
            "explain needs --exporter-url (GPU metrics), --inference-url (inference metrics) or"
            " --gateway-url (metric=pending)"
        )
    settings = build_settings(
        {
            "exporter_url": args.exporter_url,
            "inference_url": args.inference_url,
            "gateway_url": args.gateway_url,
            "scrape_timeout": args.scrape_timeout,
            "kubernetes": "off",
        }
    )
    rate_interval = _option_number(
        "--rate-interval",
        args.rate_interval,
        0,
        MAX_RATE_INTERVAL,
        f"seconds, 0 < --rate-interval <= {MAX_RATE_INTERVAL:g}",
        above=True,
    )
    entries = asyncio.run(explain_once(settings, args.namespace, args.name, triggers, rate_interval))
    if args.json:
        # As /explain answers: one trigger's entry, or the ScaledObject with every trigger's.
        shown: object = (
            entries[0]
            if len(entries) == 1
            else {"namespace": args.namespace, "scaledObject": args.name, "triggers": entries}
        )
        print(json.dumps(shown, indent=2, default=str))
    else:
        print("\n\n".join(render_table(entry) for entry in entries))
    return 0 if all("error" not in entry for entry in entries) else 1


def _option_number(
    name: str, raw: str, low: float, high: float, allowed: str, *, above: bool = False
) -> float:
    """A one-shot command's number: finite, from `low` (or above it) to `high`; refused naming the flag,
    the value and `allowed`."""
    from keda_gpu_scaler.core.value_parsers import parse_number, refuse_option

    value = parse_number(name, raw, refuse_option)
    if not (low < value if above else low <= value) or not value <= high:
        raise refuse_option(name, raw, f"is out of range; allowed: {allowed}")
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class _CalibrateNumbers:
    interval: float
    window: float
    duration: float
    waiting_above: float
    sustain: int
    prefill_weight: float
    per_token_target: float | None  # milliseconds
    scrape_timeout: float


def _calibrate_numbers(args: argparse.Namespace) -> _CalibrateNumbers:
    """calibrate's flags, each checked before anything is read: one refusal per flag, naming it."""
    from keda_gpu_scaler.core.demand import MAX_WINDOW_SECONDS
    from keda_gpu_scaler.core.value_parsers import parse_prefill_weight, refuse_option

    low, high = CALIBRATE_INTERVAL
    interval = _option_number(
        "--interval", args.interval, low, high, f"seconds, {low:g} <= --interval <= {high:g}"
    )
    window = _option_number(
        "--window",
        args.window,
        2 * interval,
        MAX_WINDOW_SECONDS,
        f"seconds, at least two --interval ({2 * interval:g}) and at most {MAX_WINDOW_SECONDS:g}",
    )
    duration = _option_number(
        "--duration",
        args.duration,
        0,
        CALIBRATE_MAX_DURATION,
        f"seconds, 0 < --duration <= {CALIBRATE_MAX_DURATION:g}",
        above=True,
    )
    waiting_above = _option_number(
        "--waiting-above",
        args.waiting_above,
        0,
        CALIBRATE_MAX_WAITING,
        f"requests, 0 <= --waiting-above <= {CALIBRATE_MAX_WAITING:g}",
    )
    sustain_raw: str = args.sustain
    if not (
        sustain_raw.isascii() and sustain_raw.isdigit() and 1 <= int(sustain_raw) <= CALIBRATE_MAX_SUSTAIN
    ):
        raise refuse_option(
            "--sustain",
            sustain_raw,
            f"is not allowed; allowed: a whole number of pages, 1-{CALIBRATE_MAX_SUSTAIN}",
        )
    prefill_weight = parse_prefill_weight("--prefill-weight", args.prefill_weight, refuse_option)
    per_token_target = (
        None
        if args.per_token_target is None
        else _option_number(
            "--per-token-target",
            args.per_token_target,
            0,
            CALIBRATE_MAX_PER_TOKEN_MS,
            f"milliseconds, 0 < --per-token-target <= {CALIBRATE_MAX_PER_TOKEN_MS:g}",
            above=True,
        )
    )
    scrape_timeout = _option_number(
        "--scrape-timeout",
        args.scrape_timeout,
        0,
        CALIBRATE_MAX_SCRAPE_TIMEOUT,
        f"seconds, 0 < --scrape-timeout <= {CALIBRATE_MAX_SCRAPE_TIMEOUT:g}",
        above=True,
    )
    if not is_http_url(args.url):  # checked before the first read, as every flag
        raise SettingsError(
            f"URL {args.url[:100]!r} is not an http(s) URL, e.g. http://10.0.3.7:8000/metrics"
        )
    numbers = (interval, window, duration, waiting_above, int(sustain_raw), prefill_weight, per_token_target)
    return _CalibrateNumbers(*numbers, scrape_timeout)


def _calibrate(args: argparse.Namespace) -> int:
    from keda_gpu_scaler import calibrate
    from keda_gpu_scaler.collect.http import client_session, exporter_fetcher

    numbers = _calibrate_numbers(args)
    if (why := calibrate.check_choices(args.engine, args.model)) is not None:
        raise SettingsError(why)  # what a demand trigger refuses can never be measured
    configure_logging("warning", "text")
    settings = build_settings({"scrape_timeout": args.scrape_timeout, "kubernetes": "off"})
    calibration = calibrate.Calibration(
        window=numbers.window,
        waiting_above=numbers.waiting_above,
        sustain=numbers.sustain,
        engine=args.engine,
        model=args.model,
        prefill_weight=numbers.prefill_weight,
        per_token_target=None if numbers.per_token_target is None else numbers.per_token_target / 1000,
    )

    async def measure() -> calibrate.Calibration:
        async with client_session() as session:
            fetcher = exporter_fetcher(session, settings)
            return await calibrate.run(
                args.url, calibration, fetch=fetcher.get, interval=numbers.interval, duration=numbers.duration
            )

    done = asyncio.run(measure())
    return 0 if done.measured else 1


def _metadata(items: Sequence[str]) -> dict[str, str]:
    metadata: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SettingsError(f"metadata {item!r} is not KEY=VALUE")
        if key in metadata:
            # A ScaledObject's map cannot hold a key twice: the last one winning silently is not what it runs.
            raise SettingsError(
                f"metadata key {key[:100]!r} is given twice, {metadata[key][:100]!r} and {value[:100]!r};"
                " give it once"
            )
        metadata[key] = value
    return metadata
