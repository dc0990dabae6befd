"""Settings: one frozen dataclass built once from flags and KEDA_GPU_SCALER_* environment variables."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from keda_gpu_scaler.discovery.selectors import (
    DEFAULT_EXPORTER_SELECTORS,
    ExporterSelector,
    SelectorError,
    parse_exporter_selector,
)

ENV_PREFIX = "KEDA_GPU_SCALER_"
# Data read through Prometheus is already as old as Prometheus' own scrape interval (15–60 s in the
# common setups) when the scaler reads it: its default staleness allows for that.
PROMETHEUS_STALENESS_MARGIN = 60.0


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
    Flag(
        "--kubeconfig",
        None,
        "kubeconfig file(s) to reach the API server, joined with ':' (default: $KUBECONFIG, else the in-cluster"
        " service account)",
    ),
    Flag(
        "--exporter-selector",
        ";".join(DEFAULT_EXPORTER_SELECTORS),
        "with Kubernetes: the GPU exporter pods, as LABEL_SELECTOR[:PORT] (PORT: a number or a container port"
        " name; none: the pod's first container port); repeatable, replaces the defaults (environment:"
        " ';'-separated)",
        repeatable=True,
    ),
    Flag(
        "--discovery-interval",
        "30",
        "seconds between re-reads of each followed ScaledObject and its scale target's /scale (pods are watched)",
    ),
    Flag("--scrape-interval", "5", "seconds between scrapes of each wanted exporter"),
    Flag("--max-staleness", None, "seconds after which data is not used (default: 3 x scrape interval)"),
    Flag(
        "--prometheus-max-staleness",
        None,
        "seconds after which data read from Prometheus is not used; it must exceed Prometheus' own scrape"
        " interval plus --scrape-interval (default: --max-staleness + 60)",
    ),
    Flag("--scrape-timeout", "3", "seconds an exporter may take to answer one scrape"),
    Flag("--max-page-bytes", "16777216", "largest exporter page or Prometheus answer accepted, in bytes"),
    Flag("--scrape-concurrency", "64", "most exporter scrapes in flight at once"),
    Flag(
        "--exporter-bearer-token-file",
        None,
        "send `Authorization: Bearer` with the token in this file to exporters (and inference servers) over"
        " HTTPS, e.g. behind kube-rbac-proxy; read again whenever it changes",
    ),
    Flag(
        "--exporter-ca-file",
        None,
        "PEM CA bundle to verify HTTPS exporters' certificates (default: the system's CAs)",
    ),
    Flag(
        "--inference-url",
        None,
        "without Kubernetes: an inference server's metrics page and the pod it belongs to, as"
        " NAMESPACE/POD=URL; repeatable (environment: comma-separated)",
        repeatable=True,
    ),
    Flag(
        "--interest-ttl",
        "600",
        "seconds a ScaledObject is remembered (and its sources collected) after the last call about it",
    ),
    Flag(
        "--max-scaledobjects",
        "5000",
        "most ScaledObjects followed at once; calls for more are RESOURCE_EXHAUSTED until others expire",
    ),
    Flag(
        "--prometheus-url",
        None,
        "read GPU metrics from this Prometheus-compatible query API (Prometheus, Thanos, Mimir,"
        " VictoriaMetrics, a managed Prometheus): the base URL, without /api/v1",
    ),
    Flag(
        "--default-source",
        "auto",
        "where triggers without `source` metadata read from: auto = prometheus when --prometheus-url is"
        " given and no --exporter-url, else scrape",
        choices=("auto", "scrape", "prometheus"),
    ),
    Flag("--prometheus-timeout", "5", "seconds one Prometheus query may take"),
    Flag(
        "--prometheus-bearer-token-file",
        None,
        "send `Authorization: Bearer` with the token in this file, read again whenever it changes",
    ),
    Flag(
        "--prometheus-username",
        None,
        "basic auth user for Prometheus; the password comes from --prometheus-password-file or the"
        " environment variable KEDA_GPU_SCALER_PROMETHEUS_PASSWORD",
    ),
    Flag(
        "--prometheus-password-file",
        None,
        "file holding the basic auth password, read again whenever it changes",
    ),
    Flag(
        "--prometheus-header",
        None,
        "extra header for every Prometheus query as `Name: value`, e.g. `X-Scope-OrgID: team-a` for Mimir;"
        " repeatable (environment: one per line)",
        repeatable=True,
    ),
    Flag("--prometheus-ca-file", None, "PEM CA bundle to verify the Prometheus server's certificate"),
    Flag("--prometheus-cert-file", None, "PEM client certificate (chain) to present to Prometheus (mTLS)"),
    Flag("--prometheus-key-file", None, "PEM private key of --prometheus-cert-file"),
    Flag("--tls-cert-file", None, "serve gRPC over TLS with this PEM certificate (chain)"),
    Flag("--tls-key-file", None, "PEM private key of --tls-cert-file"),
    Flag("--tls-client-ca-file", None, "require client certificates signed by this PEM CA (mTLS)"),
    Flag("--max-streams", "10000", "most StreamIsActive streams open at once (more: RESOURCE_EXHAUSTED)"),
    Flag(
        "--explain",
        "off",
        "serve /explain (every followed ScaledObject's pods and values) on the HTTP address; `make run`"
        " and the explain command have it on",
        choices=("on", "off"),
    ),
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
    kubeconfig: str | None = None
    exporter_selectors: tuple[ExporterSelector, ...] = tuple(
        parse_exporter_selector(s) for s in DEFAULT_EXPORTER_SELECTORS
    )
    discovery_interval: float = 30.0
    scrape_interval: float = 5.0
    max_staleness: float = 15.0
    prometheus_max_staleness: float = 75.0
    scrape_timeout: float = 3.0
    max_page_bytes: int = 16 * 1024 * 1024
    scrape_concurrency: int = 64
    interest_ttl: float = 600.0
    max_scaledobjects: int = 5000
    exporter_bearer_token_file: Path | None = None
    exporter_ca_file: Path | None = None
    # (namespace, pod, url) of each --inference-url
    inference_urls: tuple[tuple[str, str, str], ...] = ()
    explain: bool = False
    prometheus_url: str | None = None
    default_source: str = "scrape"  # resolved from --default-source: "scrape" or "prometheus"
    prometheus_timeout: float = 5.0
    prometheus_bearer_token_file: Path | None = None
    prometheus_username: str | None = None
    prometheus_password_file: Path | None = None
    # Secrets never appear in a repr (logs, tracebacks): header values can be API keys too.
    prometheus_password: str | None = field(default=None, repr=False)
    prometheus_headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    prometheus_ca_file: Path | None = None
    prometheus_cert_file: Path | None = None
    prometheus_key_file: Path | None = None
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


def _existing_file(name: str, raw: str | None) -> Path | None:
    if not raw:
        return None
    if not Path(raw).is_file():
        raise SettingsError(f"{name}={raw!r}: no such file")
    return Path(raw)


_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


def _inference_urls(items: str | list[str] | None) -> tuple[tuple[str, str, str], ...]:
    texts = [items] if isinstance(items, str) else items or []
    found: dict[tuple[str, str], str] = {}
    for part in (p.strip() for text in texts for p in text.split(",")):
        if not part:
            continue
        ref, sep, url = part.partition("=")
        namespace, slash, pod = ref.partition("/")
        if not sep or not slash:
            raise SettingsError(
                f"--inference-url={part[:100]!r} is not NAMESPACE/POD=URL, e.g. llm/vllm-0=http://10.0.0.5:8000/metrics"
            )
        if not _DNS_LABEL.fullmatch(namespace) or len(namespace) > 63:
            raise SettingsError(f"--inference-url={part[:100]!r}: {namespace[:100]!r} is not a namespace name")
        if not _DNS_SUBDOMAIN.fullmatch(pod) or len(pod) > 253:
            raise SettingsError(f"--inference-url={part[:100]!r}: {pod[:100]!r} is not a pod name")
        if not url.startswith(("http://", "https://")):
            raise SettingsError(f"--inference-url={part[:100]!r}: {url[:100]!r} is not an http(s) URL")
        if (namespace, pod) in found and found[(namespace, pod)] != url:
            raise SettingsError(f"--inference-url: pod {namespace}/{pod} is given two URLs")
        found[(namespace, pod)] = url
    return tuple((ns, pod, url) for (ns, pod), url in found.items())


def kubernetes_available(environ: Mapping[str, str]) -> bool:
    token = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
    return (bool(environ.get("KUBERNETES_SERVICE_HOST")) and token.exists()) or bool(
        environ.get("KUBECONFIG")
    )


def _exporter_selectors(items: str | list[str] | None) -> tuple[ExporterSelector, ...]:
    texts = [items] if isinstance(items, str) else items or []
    parts = [p.strip() for text in texts for p in text.split(";") if p.strip()]
    try:
        return tuple(parse_exporter_selector(p) for p in parts or DEFAULT_EXPORTER_SELECTORS)
    except SelectorError as error:
        raise SettingsError(f"--exporter-selector: {error}") from None


def resolve_kubernetes(settings: Settings, environ: Mapping[str, str]) -> Settings:
    """Turn --kubernetes auto into on or off, and fill the kubeconfig from $KUBECONFIG when not given."""
    kubeconfig = settings.kubeconfig or environ.get("KUBECONFIG") or None
    mode = settings.kubernetes
    if mode == "auto":
        mode = "on" if kubeconfig or kubernetes_available(environ) else "off"
    return dataclasses.replace(settings, kubernetes=mode, kubeconfig=kubeconfig)


# A secret that has no flag (a flag's value shows in `ps`): read from the environment only.
PROMETHEUS_PASSWORD_ENV = ENV_PREFIX + "PROMETHEUS_PASSWORD"
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


def prometheus_settings(
    values: Mapping[str, str | list[str] | None], *, has_exporters: bool
) -> dict[str, Any]:
    """The Prometheus source's Settings fields, checked together (they only make sense as a whole)."""

    def raw(dest: str) -> str | None:
        value = values.get(dest)
        return value if isinstance(value, str) and value else None

    url = raw("prometheus_url")
    if url is not None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SettingsError(f"--prometheus-url={url!r} is not an http(s) URL")
        if parts.username or parts.password:
            raise SettingsError(
                "--prometheus-url: no credentials in the URL; use --prometheus-username with"
                f" --prometheus-password-file or {PROMETHEUS_PASSWORD_ENV}"
            )
        if parts.query or parts.fragment or "/api/v1" in parts.path:
            raise SettingsError(
                f"--prometheus-url={url!r}: give the base URL (what comes before /api/v1/query), e.g."
                " http://prometheus.monitoring:9090 or http://mimir/prometheus"
            )
        url = url.rstrip("/")
    choice = raw("default_source") or "auto"
    if choice not in ("auto", "scrape", "prometheus"):
        raise SettingsError(f"--default-source={choice!r}; allowed: auto, scrape, prometheus")
    if choice == "prometheus" and url is None:
        raise SettingsError("--default-source=prometheus needs --prometheus-url")
    if choice == "auto":
        choice = "prometheus" if url is not None and not has_exporters else "scrape"

    files: dict[str, Path | None] = {}
    for dest in ("bearer_token_file", "password_file", "ca_file", "cert_file", "key_file"):
        path = raw(f"prometheus_{dest}")
        if path is not None and not Path(path).is_file():
            raise SettingsError(f"--prometheus-{dest.replace('_', '-')}={path!r}: no such file")
        files[dest] = Path(path) if path is not None else None
    if (files["cert_file"] is None) != (files["key_file"] is None):
        raise SettingsError("--prometheus-cert-file and --prometheus-key-file must be given together")
    username, password = raw("prometheus_username"), raw("prometheus_password")
    if password is not None and files["password_file"] is not None:
        raise SettingsError(f"give --prometheus-password-file or {PROMETHEUS_PASSWORD_ENV}, not both")
    has_password = password is not None or files["password_file"] is not None
    if username is not None and not has_password:
        raise SettingsError(
            f"--prometheus-username needs a password: --prometheus-password-file or {PROMETHEUS_PASSWORD_ENV}"
        )
    if has_password and username is None:
        raise SettingsError("a Prometheus password is set but --prometheus-username is not")
    if username is not None and files["bearer_token_file"] is not None:
        raise SettingsError("give --prometheus-bearer-token-file or --prometheus-username, not both")

    headers: list[tuple[str, str]] = []
    items = values.get("prometheus_header") or []
    for item in [items] if isinstance(items, str) else items:
        for line in item.splitlines():
            if not line.strip():
                continue
            name, sep, value = line.partition(":")
            name, value = name.strip(), value.strip()
            if not sep or not _HEADER_NAME.fullmatch(name):
                # The value is not echoed: it may be a secret.
                raise SettingsError(f"--prometheus-header {name[:40]!r}…: not `Name: value`")
            if name.lower() == "authorization" and (username or files["bearer_token_file"]):
                raise SettingsError(
                    "--prometheus-header Authorization conflicts with the bearer token or basic auth"
                )
            headers.append((name, value))

    given = [f for f in ("username", "timeout", "header") if values.get(f"prometheus_{f}")]
    given += [f for f, path in files.items() if path is not None]
    if url is None and (given or password is not None):
        raise SettingsError(
            f"--prometheus-{given[0].replace('_', '-') if given else 'password'} needs --prometheus-url"
        )
    return {
        "prometheus_url": url,
        "default_source": choice,
        "prometheus_timeout": _positive("--prometheus-timeout", raw("prometheus_timeout") or "5", float),
        "prometheus_bearer_token_file": files["bearer_token_file"],
        "prometheus_username": username,
        "prometheus_password_file": files["password_file"],
        "prometheus_password": password,
        "prometheus_headers": tuple(headers),
        "prometheus_ca_file": files["ca_file"],
        "prometheus_cert_file": files["cert_file"],
        "prometheus_key_file": files["key_file"],
    }


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
        kubeconfig=raw("kubeconfig") or None,
        exporter_selectors=_exporter_selectors(values.get("exporter_selector")),
        discovery_interval=_positive("--discovery-interval", raw("discovery_interval") or "30", float),
        scrape_interval=interval,
        max_staleness=staleness,
        prometheus_max_staleness=(
            _positive("--prometheus-max-staleness", prometheus_staleness_raw, float)
            if (prometheus_staleness_raw := raw("prometheus_max_staleness"))
            else staleness + PROMETHEUS_STALENESS_MARGIN
        ),
        scrape_timeout=_positive("--scrape-timeout", raw("scrape_timeout") or "3", float),
        max_page_bytes=int(_positive("--max-page-bytes", raw("max_page_bytes") or "16777216", int)),
        scrape_concurrency=int(_positive("--scrape-concurrency", raw("scrape_concurrency") or "64", int)),
        interest_ttl=_positive("--interest-ttl", raw("interest_ttl") or "600", float),
        max_scaledobjects=int(_positive("--max-scaledobjects", raw("max_scaledobjects") or "5000", int)),
        exporter_bearer_token_file=_existing_file("--exporter-bearer-token-file", raw("exporter_bearer_token_file")),
        exporter_ca_file=_existing_file("--exporter-ca-file", raw("exporter_ca_file")),
        inference_urls=_inference_urls(values.get("inference_url")),
        explain=(raw("explain") or "off") == "on",
        **prometheus_settings(values, has_exporters=bool(urls)),
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
    if PROMETHEUS_PASSWORD_ENV in environ:
        found["prometheus_password"] = environ[PROMETHEUS_PASSWORD_ENV]
    return found
