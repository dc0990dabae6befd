"""Settings: one frozen dataclass built once from flags and KEDA_GPU_SCALER_* environment variables."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keda_gpu_scaler.core.selectors import DEFAULT_EXPORTER_SELECTORS, ExporterSelector

# The flags' value parsers (core/value_parsers.py); SettingsError and the constants are re-exported here.
from keda_gpu_scaler.core.value_parsers import (
    ENV_PREFIX,
    PROMETHEUS_PASSWORD_ENV,
    Parser,
    Raw,
    SettingsError,
    _address,
    _choice,
    _exporter_selectors,
    _gateway_urls,
    _headers,
    _inference_urls,
    _path,
    _positive,
    _prometheus_url,
    _serviceaccount,
    _switch,
    _text,
    _token_path,
    _urls,
)

__all__ = ["ENV_PREFIX", "FLAGS", "PROMETHEUS_PASSWORD_ENV", "Flag", "Raw", "Settings", "SettingsError"]

# Data read through Prometheus is already as old as Prometheus' own scrape interval (15–60 s in the
# common setups) when the scaler reads it: its default staleness allows for that.
PROMETHEUS_STALENESS_MARGIN = 60.0


@dataclass(frozen=True, slots=True)
class Flag:
    """One `serve` flag: its name, default (as the user would type it), help, parser and Settings field."""

    name: str
    default: str | None
    help: str
    repeatable: bool = False
    choices: tuple[str, ...] | None = None
    parse: Parser = _text
    field: str | None = None  # the Settings field, when it is not the flag's own name

    def __post_init__(self) -> None:
        if self.choices is not None and self.parse is _text:
            object.__setattr__(self, "parse", _choice(*self.choices))

    @property
    def settings_field(self) -> str:
        return self.field or self.dest

    @property
    def typed_default(self) -> Any:
        return self.parse(self.name, self.default)

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.removeprefix("--").replace("-", "_").upper()

    @property
    def dest(self) -> str:
        return self.name.removeprefix("--").replace("-", "_")


# The one table of `serve` flags: the CLI is built from it and docs/reference.md's table is checked against it.
FLAGS: tuple[Flag, ...] = (
    Flag(
        "--grpc-address",
        "0.0.0.0:6000",
        "address of the gRPC ExternalScaler, health and reflection services",
        parse=_address,
    ),
    Flag(
        "--http-address",
        "0.0.0.0:8080",
        "address of /metrics, /healthz, /readyz and /explain",
        parse=_address,
    ),
    Flag(
        "--exporter-url",
        None,
        "a static exporter endpoint (dcgm-exporter, AMD device-metrics-exporter, ACK); repeatable"
        " (environment: comma-separated)",
        repeatable=True,
        parse=_urls,
        field="exporter_urls",
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
        parse=_exporter_selectors,
        field="exporter_selectors",
    ),
    Flag(
        "--discovery-interval",
        "30",
        "seconds between re-reads of each followed scale target's /scale, and of a ScaledObject not found yet"
        " (followed ScaledObjects and pods are watched)",
        parse=_positive(float),
    ),
    Flag("--scrape-interval", "5", "seconds between scrapes of each wanted exporter", parse=_positive(float)),
    Flag(
        "--max-staleness",
        None,
        "seconds after which data is not used (default: 3 x scrape interval)",
        parse=_positive(float),
    ),
    Flag(
        "--prometheus-max-staleness",
        None,
        "seconds after which data read from Prometheus is not used; it must exceed Prometheus' own scrape"
        " interval plus --scrape-interval (default: --max-staleness + 60)",
        parse=_positive(float),
    ),
    Flag(
        "--scrape-timeout", "3", "seconds an exporter may take to answer one scrape", parse=_positive(float)
    ),
    Flag(
        "--max-page-bytes",
        "16777216",
        "largest exporter page or Prometheus answer accepted, in bytes",
        parse=_positive(int),
    ),
    Flag(
        "--scrape-concurrency",
        "64",
        "scrapes in flight at once per kind of page, shared fairly between namespaces: each namespace also has"
        " 2 of its own that no other can take, and uses at most half of these while another namespace wants one",
        parse=_positive(int),
    ),
    Flag(
        "--exporter-bearer-token-file",
        None,
        "send `Authorization: Bearer` with the token in this file to exporters (and inference servers) over"
        " HTTPS, e.g. behind kube-rbac-proxy; read again whenever it changes",
        parse=_path,
    ),
    Flag(
        "--exporter-ca-file",
        None,
        "PEM CA bundle to verify HTTPS exporters' certificates (default: the system's CAs)",
        parse=_path,
    ),
    Flag(
        "--inference-url",
        None,
        "without Kubernetes: an inference server's metrics page and the pod it belongs to, as"
        " NAMESPACE/POD=URL; repeatable (environment: comma-separated)",
        repeatable=True,
        parse=_inference_urls,
        field="inference_urls",
    ),
    Flag(
        "--gateway-url",
        None,
        "without Kubernetes: an inference gateway endpoint picker's metrics page and the InferencePool it"
        " serves, as NAMESPACE/POOL=URL; one per endpoint-picker replica; repeatable (environment:"
        " comma-separated)",
        repeatable=True,
        parse=_gateway_urls,
        field="gateway_urls",
    ),
    Flag(
        "--gateway-interval",
        "1",
        "seconds between scrapes of each wanted endpoint-picker page (the wake from zero follows within"
        " this); their data is stale after 3 intervals",
        parse=_positive(float),
    ),
    Flag(
        "--gateway-ca-file",
        None,
        "PEM CA bundle to verify endpoint pickers that serve their metrics over HTTPS; the scaler's service"
        " account token goes to them only once their certificate verified. With it, host names are not"
        " checked (pickers are reached by pod IP): give a CA that signs endpoint-picker certificates only"
        " (default: the system's CAs, host names checked)",
        parse=_path,
    ),
    Flag(
        "--gateway-token-file",
        None,
        "bearer token for endpoint pickers' metrics (llm-d's EPP asks for one by default), read again"
        " whenever it changes: the token of a ServiceAccount of its own whose only right is `get` on the"
        " non-resource URL /metrics (the chart's gateway.metricsToken). Sent over HTTPS, over plain HTTP"
        " only with --gateway-token-plain-http on (default: the scaler's own service account token, over"
        " verified HTTPS only)",
        parse=_token_path,
    ),
    Flag(
        "--gateway-token-serviceaccount",
        None,
        "with Kubernetes: the ServiceAccount, as NAMESPACE/NAME, whose tokens endpoint pickers get for their"
        " metrics; its only right is `get` on the non-resource URL /metrics. The scaler mints them through"
        " the TokenRequest API (10-minute tokens, renewed in the background before they expire), which"
        " needs `create` on serviceaccounts/token for that name (the chart's gateway.metricsToken)."
        " Instead of --gateway-token-file",
        parse=_serviceaccount,
    ),
    Flag(
        "--gateway-token-plain-http",
        "off",
        "also send the limited token (--gateway-token-serviceaccount's or --gateway-token-file's) to endpoint"
        " pickers serving their metrics over plain HTTP (llm-d's default) inside the cluster; the scaler's own"
        " token never goes over plain HTTP",
        choices=("on", "off"),
        parse=_switch,
    ),
    Flag(
        "--interest-ttl",
        "600",
        "seconds a ScaledObject is remembered (and its sources collected) after the last call about it",
        parse=_positive(float),
    ),
    Flag(
        "--max-scaledobjects",
        "5000",
        "most ScaledObjects followed at once, each namespace with a fair share (the cap ÷ the namespaces"
        " followed); at the cap, one not called for 60 s (or --interest-ttl, if shorter) gives way, else a"
        " namespace below its share takes the least recently called of the largest namespace; a namespace at"
        " or above its share is RESOURCE_EXHAUSTED",
        parse=_positive(int),
    ),
    Flag(
        "--prometheus-url",
        None,
        "read GPU metrics from this Prometheus-compatible query API (Prometheus, Thanos, Mimir,"
        " VictoriaMetrics, a managed Prometheus): the base URL, without /api/v1",
        parse=_prometheus_url,
    ),
    Flag(
        "--default-source",
        "auto",
        "where triggers without `source` metadata read from: auto = prometheus when --prometheus-url is"
        " given and no --exporter-url, else scrape",
        choices=("auto", "scrape", "prometheus"),
    ),
    Flag("--prometheus-timeout", "5", "seconds one Prometheus query may take", parse=_positive(float)),
    Flag(
        "--prometheus-bearer-token-file",
        None,
        "send `Authorization: Bearer` with the token in this file, read again whenever it changes",
        parse=_path,
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
        parse=_path,
    ),
    Flag(
        "--prometheus-header",
        None,
        "extra header for every Prometheus query as `Name: value`, e.g. `X-Scope-OrgID: team-a` for Mimir;"
        " repeatable (environment: one per line)",
        repeatable=True,
        parse=_headers,
        field="prometheus_headers",
    ),
    Flag(
        "--prometheus-ca-file",
        None,
        "PEM CA bundle to verify the Prometheus server's certificate",
        parse=_path,
    ),
    Flag(
        "--prometheus-cert-file",
        None,
        "PEM client certificate (chain) to present to Prometheus (mTLS)",
        parse=_path,
    ),
    Flag("--prometheus-key-file", None, "PEM private key of --prometheus-cert-file", parse=_path),
    Flag("--tls-cert-file", None, "serve gRPC over TLS with this PEM certificate (chain)", parse=_path),
    Flag("--tls-key-file", None, "PEM private key of --tls-cert-file", parse=_path),
    Flag(
        "--tls-client-ca-file", None, "require client certificates signed by this PEM CA (mTLS)", parse=_path
    ),
    Flag(
        "--max-streams",
        "10000",
        "most streams of each streaming RPC (StreamIsActive, StreamMetricSpec) open at once (more:"
        " RESOURCE_EXHAUSTED)",
        parse=_positive(int),
    ),
    Flag(
        "--keepalive-time",
        "30",
        "seconds of silence on a gRPC connection after which the scaler pings the peer (KEDA sends no"
        " pings of its own)",
        parse=_positive(float),
    ),
    Flag(
        "--keepalive-timeout",
        "10",
        "seconds a pinged peer has to answer before its connection (and its StreamIsActive streams) is dropped",
        parse=_positive(float),
    ),
    Flag(
        "--explain",
        "off",
        "serve /explain (every followed ScaledObject's pods and values) on the HTTP address; `make run`"
        " and the explain command have it on",
        choices=("on", "off"),
        parse=_switch,
    ),
    Flag(
        "--shutdown-grace",
        "10",
        "seconds in-flight calls may take to finish on SIGTERM",
        parse=_positive(float),
    ),
    Flag("--log-level", "info", "log level", choices=("debug", "info", "warning", "error")),
    Flag("--log-format", "text", "log format", choices=("text", "json")),
)


_BY_NAME = {flag.name: flag for flag in FLAGS}


def _default(name: str) -> Any:
    """A Settings field's default: the flag's own default text, parsed by the flag's own parser."""
    return _BY_NAME[name].typed_default


@dataclass(frozen=True, slots=True)
class Settings:
    """Every `serve` setting, typed. Defaults come from FLAGS, so the CLI, the environment and code agree."""

    grpc_address: str = _default("--grpc-address")
    http_address: str = _default("--http-address")
    exporter_urls: tuple[str, ...] = _default("--exporter-url")
    kubernetes: str = _default("--kubernetes")
    kubeconfig: str | None = _default("--kubeconfig")
    exporter_selectors: tuple[ExporterSelector, ...] = _default("--exporter-selector")
    discovery_interval: float = _default("--discovery-interval")
    scrape_interval: float = _default("--scrape-interval")
    # None in FLAGS: derived from --scrape-interval (see build_settings); these are the derived defaults.
    max_staleness: float = 3 * _default("--scrape-interval")
    prometheus_max_staleness: float = 3 * _default("--scrape-interval") + PROMETHEUS_STALENESS_MARGIN
    scrape_timeout: float = _default("--scrape-timeout")
    max_page_bytes: int = _default("--max-page-bytes")
    scrape_concurrency: int = _default("--scrape-concurrency")
    exporter_bearer_token_file: Path | None = _default("--exporter-bearer-token-file")
    exporter_ca_file: Path | None = _default("--exporter-ca-file")
    # (namespace, pod, url) of each --inference-url
    inference_urls: tuple[tuple[str, str, str], ...] = _default("--inference-url")
    # (namespace, pool, url) of each --gateway-url
    gateway_urls: tuple[tuple[str, str, str], ...] = _default("--gateway-url")
    gateway_interval: float = _default("--gateway-interval")
    gateway_ca_file: Path | None = _default("--gateway-ca-file")
    gateway_token_file: Path | None = _default("--gateway-token-file")
    # (namespace, name) of --gateway-token-serviceaccount
    gateway_token_serviceaccount: tuple[str, str] | None = _default("--gateway-token-serviceaccount")
    gateway_token_plain_http: bool = _default("--gateway-token-plain-http")
    interest_ttl: float = _default("--interest-ttl")
    max_scaledobjects: int = _default("--max-scaledobjects")
    prometheus_url: str | None = _default("--prometheus-url")
    default_source: str = "scrape"  # --default-source resolved: "scrape" or "prometheus"
    prometheus_timeout: float = _default("--prometheus-timeout")
    prometheus_bearer_token_file: Path | None = _default("--prometheus-bearer-token-file")
    prometheus_username: str | None = _default("--prometheus-username")
    prometheus_password_file: Path | None = _default("--prometheus-password-file")
    # Secrets never appear in a repr (logs, tracebacks): header values can be API keys too.
    prometheus_password: str | None = field(default=None, repr=False)
    prometheus_headers: tuple[tuple[str, str], ...] = field(
        default=_default("--prometheus-header"), repr=False
    )
    prometheus_ca_file: Path | None = _default("--prometheus-ca-file")
    prometheus_cert_file: Path | None = _default("--prometheus-cert-file")
    prometheus_key_file: Path | None = _default("--prometheus-key-file")
    tls_cert_file: Path | None = _default("--tls-cert-file")
    tls_key_file: Path | None = _default("--tls-key-file")
    tls_client_ca_file: Path | None = _default("--tls-client-ca-file")
    max_streams: int = _default("--max-streams")
    keepalive_time: float = _default("--keepalive-time")
    keepalive_timeout: float = _default("--keepalive-timeout")
    explain: bool = _default("--explain")
    shutdown_grace: float = _default("--shutdown-grace")
    log_level: str = _default("--log-level")
    log_format: str = _default("--log-format")


def kubernetes_available(environ: Mapping[str, str]) -> bool:
    token = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
    return (bool(environ.get("KUBERNETES_SERVICE_HOST")) and token.exists()) or bool(
        environ.get("KUBECONFIG")
    )


def resolve_kubernetes(settings: Settings, environ: Mapping[str, str]) -> Settings:
    """Turn --kubernetes auto into on or off, and fill the kubeconfig from $KUBECONFIG when not given."""
    kubeconfig = settings.kubeconfig or environ.get("KUBECONFIG") or None
    mode = settings.kubernetes
    if mode == "auto":
        mode = "on" if kubeconfig or kubernetes_available(environ) else "off"
    return dataclasses.replace(settings, kubernetes=mode, kubeconfig=kubeconfig)


def _check_prometheus(v: dict[str, Any]) -> None:
    """The Prometheus source's flags only make sense together: check them as a whole."""
    url = v["prometheus_url"]
    if v["default_source"] == "prometheus" and url is None:
        raise SettingsError("--default-source=prometheus needs --prometheus-url")
    if v["default_source"] == "auto":
        v["default_source"] = "prometheus" if url is not None and not v["exporter_urls"] else "scrape"
    if (v["prometheus_cert_file"] is None) != (v["prometheus_key_file"] is None):
        raise SettingsError("--prometheus-cert-file and --prometheus-key-file must be given together")
    username, password = v["prometheus_username"], v["prometheus_password"]
    if password is not None and v["prometheus_password_file"] is not None:
        raise SettingsError(f"give --prometheus-password-file or {PROMETHEUS_PASSWORD_ENV}, not both")
    has_password = password is not None or v["prometheus_password_file"] is not None
    if username is not None and not has_password:
        raise SettingsError(
            f"--prometheus-username needs a password: --prometheus-password-file or {PROMETHEUS_PASSWORD_ENV}"
        )
    if has_password and username is None:
        raise SettingsError("a Prometheus password is set but --prometheus-username is not")
    if username is not None and v["prometheus_bearer_token_file"] is not None:
        raise SettingsError("give --prometheus-bearer-token-file or --prometheus-username, not both")
    if any(name.lower() == "authorization" for name, _ in v["prometheus_headers"]) and (
        username or v["prometheus_bearer_token_file"]
    ):
        raise SettingsError("--prometheus-header Authorization conflicts with the bearer token or basic auth")
    if url is None:
        dependent = [
            flag.name
            for flag in FLAGS
            if flag.name.startswith("--prometheus-")
            and flag.name not in ("--prometheus-url", "--prometheus-max-staleness")
            and v[flag.settings_field] != flag.typed_default
        ]
        if dependent or password is not None:
            raise SettingsError(
                f"{dependent[0] if dependent else PROMETHEUS_PASSWORD_ENV} needs --prometheus-url"
            )


def _check_gateway_token(v: dict[str, Any]) -> None:
    """The endpoint pickers' token: a file or minted tokens of a ServiceAccount, never both."""
    minted = v["gateway_token_serviceaccount"]
    if minted is not None and v["gateway_token_file"] is not None:
        raise SettingsError(
            "give --gateway-token-file or --gateway-token-serviceaccount, not both: one token goes to"
            " endpoint pickers (a file you keep fresh, or tokens the scaler mints)"
        )
    if minted is not None and v["kubernetes"] == "off":
        raise SettingsError(
            "--gateway-token-serviceaccount needs Kubernetes (--kubernetes on or auto): its tokens are minted"
            " through the API server; without it give --gateway-token-file"
        )
    if v["gateway_token_plain_http"] and v["gateway_token_file"] is None and minted is None:
        raise SettingsError(
            "--gateway-token-plain-http=on needs --gateway-token-file or --gateway-token-serviceaccount: the"
            " scaler's own service account token never goes over plain HTTP"
        )


def build_settings(values: Mapping[str, str | list[str] | None]) -> Settings:
    """values: flag dest → raw string (list for repeatable flags), already merged from flags and env.

    Every flag is parsed by its own parser from FLAGS (a value from the environment is checked exactly
    like one from the command line); then the flags that depend on each other are checked together.
    """
    parsed: dict[str, Any] = {}
    for flag in FLAGS:
        raw = values.get(flag.dest)
        if raw is None or raw == "" or raw == []:
            raw = flag.default
        parsed[flag.settings_field] = flag.parse(flag.name, raw)
    parsed["prometheus_password"] = _text(PROMETHEUS_PASSWORD_ENV, values.get("prometheus_password"))
    if parsed["max_staleness"] is None:
        parsed["max_staleness"] = 3 * parsed["scrape_interval"]
    if parsed["prometheus_max_staleness"] is None:
        parsed["prometheus_max_staleness"] = parsed["max_staleness"] + PROMETHEUS_STALENESS_MARGIN
    if (parsed["tls_cert_file"] is None) != (parsed["tls_key_file"] is None):
        raise SettingsError("--tls-cert-file and --tls-key-file must be given together")
    if parsed["tls_client_ca_file"] is not None and parsed["tls_cert_file"] is None:
        raise SettingsError("--tls-client-ca-file (mTLS) needs --tls-cert-file and --tls-key-file")
    _check_gateway_token(parsed)
    _check_prometheus(parsed)
    return Settings(**parsed)


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
