"""Settings: one frozen dataclass built once from flags and KEDA_GPU_SCALER_* environment variables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ENV_PREFIX = "KEDA_GPU_SCALER_"


@dataclass(frozen=True, slots=True)
class Flag:
    """One `serve` flag: its name, default (as the user would type it), and help text."""

    name: str
    default: str | None
    help: str
    repeatable: bool = False
    choices: tuple[str, ...] | None = None

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.removeprefix("--").replace("-", "_").upper()

    @property
    def dest(self) -> str:
        return self.name.removeprefix("--").replace("-", "_")


# The one table of `serve` flags: the CLI is built from it and the README's table is checked against it.
FLAGS: tuple[Flag, ...] = (
    Flag(
        "--grpc-address", "0.0.0.0:6000", "address of the gRPC ExternalScaler, health and reflection services"
    ),
    Flag("--http-address", "0.0.0.0:8080", "address of /metrics, /healthz, /readyz and /explain"),
    Flag(
        "--exporter-url",
        None,
        "a static exporter endpoint (dcgm-exporter, AMD device-metrics-exporter, ACK); repeatable"
        " (environment: comma-separated)",
        repeatable=True,
    ),
    Flag(
        "--kubernetes",
        "auto",
        "Kubernetes discovery: auto = on when an in-cluster service account or KUBECONFIG is present",
        choices=("auto", "on", "off"),
    ),
    Flag("--scrape-interval", "5", "seconds between scrapes of each wanted exporter"),
    Flag("--max-staleness", None, "seconds after which data is not used (default: 3 x scrape interval)"),
    Flag("--scrape-timeout", "3", "seconds an exporter may take to answer one scrape"),
    Flag("--max-page-bytes", "16777216", "largest exporter page accepted, in bytes"),
    Flag("--scrape-concurrency", "64", "most exporter scrapes in flight at once"),
    Flag(
        "--interest-ttl", "600", "seconds exporters keep being scraped after the last call that wanted them"
    ),
    Flag(
        "--prometheus-url", None, "read GPU metrics from this Prometheus-compatible API (not available yet)"
    ),
    Flag("--tls-cert-file", None, "serve gRPC over TLS with this PEM certificate (chain)"),
    Flag("--tls-key-file", None, "PEM private key of --tls-cert-file"),
    Flag("--tls-client-ca-file", None, "require client certificates signed by this PEM CA (mTLS)"),
    Flag("--max-streams", "10000", "most StreamIsActive streams open at once (more: RESOURCE_EXHAUSTED)"),
    Flag("--shutdown-grace", "10", "seconds in-flight calls may take to finish on SIGTERM"),
    Flag("--log-level", "info", "log level", choices=("debug", "info", "warning", "error")),
    Flag("--log-format", "text", "log format", choices=("text", "json")),
)


class SettingsError(ValueError):
    """A flag or environment value that cannot be used; the message names it and what is allowed."""


@dataclass(frozen=True, slots=True)
class Settings:
    grpc_address: str = "0.0.0.0:6000"
    http_address: str = "0.0.0.0:8080"
    exporter_urls: tuple[str, ...] = ()
    kubernetes: str = "auto"
    scrape_interval: float = 5.0
    max_staleness: float = 15.0
    scrape_timeout: float = 3.0
    max_page_bytes: int = 16 * 1024 * 1024
    scrape_concurrency: int = 64
    interest_ttl: float = 600.0
    prometheus_url: str | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_client_ca_file: Path | None = None
    max_streams: int = 10000
    shutdown_grace: float = 10.0
    log_level: str = "info"
    log_format: str = "text"


def _positive(name: str, raw: str, kind: type[float] | type[int]) -> float:
    try:
        value = kind(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a{'n integer' if kind is int else ' number'}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise SettingsError(f"{name}={raw!r} must be a finite number > 0")
    return value


def _address(name: str, raw: str) -> str:
    _, sep, port = raw.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise SettingsError(f"{name}={raw!r} is not an address; allowed: HOST:PORT, e.g. 0.0.0.0:6000")
    return raw


def kubernetes_available(environ: Mapping[str, str]) -> bool:
    token = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
    return (bool(environ.get("KUBERNETES_SERVICE_HOST")) and token.exists()) or bool(
        environ.get("KUBECONFIG")
    )


def build_settings(values: Mapping[str, str | list[str] | None]) -> Settings:
    """values: flag dest → raw string (list for repeatable flags), already merged from flags and env."""

    def raw(dest: str) -> str | None:
        value = values.get(dest)
        return value if isinstance(value, str) else None

    urls: list[str] = []
    for item in values.get("exporter_url") or []:
        urls.extend(u.strip() for u in item.split(",") if u.strip())
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise SettingsError(f"--exporter-url={url!r} is not an http(s) URL")
    interval = _positive("--scrape-interval", raw("scrape_interval") or "5", float)
    staleness_raw = raw("max_staleness")
    staleness = _positive("--max-staleness", staleness_raw, float) if staleness_raw else 3 * interval
    tls = {
        name: Path(v) if (v := raw(name)) else None
        for name in ("tls_cert_file", "tls_key_file", "tls_client_ca_file")
    }
    if (tls["tls_cert_file"] is None) != (tls["tls_key_file"] is None):
        raise SettingsError("--tls-cert-file and --tls-key-file must be given together")
    if tls["tls_client_ca_file"] is not None and tls["tls_cert_file"] is None:
        raise SettingsError("--tls-client-ca-file (mTLS) needs --tls-cert-file and --tls-key-file")
    for flag_name, path in tls.items():
        if path is not None and not path.is_file():
            raise SettingsError(f"--{flag_name.replace('_', '-')}={str(path)!r}: no such file")
    return Settings(
        grpc_address=_address("--grpc-address", raw("grpc_address") or "0.0.0.0:6000"),
        http_address=_address("--http-address", raw("http_address") or "0.0.0.0:8080"),
        exporter_urls=tuple(dict.fromkeys(urls)),
        kubernetes=raw("kubernetes") or "auto",
        scrape_interval=interval,
        max_staleness=staleness,
        scrape_timeout=_positive("--scrape-timeout", raw("scrape_timeout") or "3", float),
        max_page_bytes=int(_positive("--max-page-bytes", raw("max_page_bytes") or "16777216", int)),
        scrape_concurrency=int(_positive("--scrape-concurrency", raw("scrape_concurrency") or "64", int)),
        interest_ttl=_positive("--interest-ttl", raw("interest_ttl") or "600", float),
        prometheus_url=raw("prometheus_url"),
        tls_cert_file=tls["tls_cert_file"],
        tls_key_file=tls["tls_key_file"],
        tls_client_ca_file=tls["tls_client_ca_file"],
        max_streams=int(_positive("--max-streams", raw("max_streams") or "10000", int)),
        shutdown_grace=_positive("--shutdown-grace", raw("shutdown_grace") or "10", float),
        log_level=raw("log_level") or "info",
        log_format=raw("log_format") or "text",
    )


def env_values(environ: Mapping[str, str] | None = None) -> dict[str, str | list[str]]:
    """Flag values from KEDA_GPU_SCALER_* environment variables (flags given on the command line win)."""
    environ = os.environ if environ is None else environ
    found: dict[str, str | list[str]] = {}
    for flag in FLAGS:
        if flag.env in environ:
            value = environ[flag.env]
            found[flag.dest] = [value] if flag.repeatable else value
    return found
