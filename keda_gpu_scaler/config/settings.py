"""Settings: one frozen dataclass built once from flags and KEDA_GPU_SCALER_* environment variables."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# SettingsError and the constants are re-exported from here.
from keda_gpu_scaler.config.flags import FLAGS
from keda_gpu_scaler.core.selectors import ExporterSelector
from keda_gpu_scaler.core.value_parsers import (
    ENV_PREFIX,
    PROMETHEUS_PASSWORD_ENV,
    Raw,
    SettingsError,
    _text,
)

__all__ = ["ENV_PREFIX", "PROMETHEUS_PASSWORD_ENV", "Raw", "Settings", "SettingsError"]

# Data read through Prometheus is already as old as Prometheus' own scrape interval (15–60 s in the
# common setups) when the scaler reads it: its default staleness allows for that.
PROMETHEUS_STALENESS_MARGIN = 60.0


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
    exporter_namespaces: frozenset[str] | None = _default("--exporter-namespaces")  # None: any
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
        _check_mode(mode, settings.inference_urls, None, "--kubernetes auto, found Kubernetes, so on")
    return dataclasses.replace(settings, kubernetes=mode, kubeconfig=kubeconfig)


def _check_mode(mode: str, inference_urls: tuple[Any, ...], kubeconfig: str | None, said: str) -> None:
    """Flags the Kubernetes mode never reads, refused naming both: silently ignored, a typo'd mode would
    go unnoticed."""
    if mode == "on" and inference_urls:
        raise SettingsError(
            f"--inference-url is read without Kubernetes only ({said}): with it, pods' pages are found"
            " through discovery; remove --inference-url or set --kubernetes off"
        )
    if mode == "off" and kubeconfig is not None:
        raise SettingsError(
            f"--kubeconfig is read with Kubernetes only ({said}); remove it or set --kubernetes on"
        )


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
        # A page answered within --scrape-timeout comes an interval plus that answer after the last one:
        # at short intervals 3 intervals are less (0.5 s: 1.5 s against a 3 s timeout) and it flapped stale.
        interval, timeout = parsed["scrape_interval"], parsed["scrape_timeout"]
        parsed["max_staleness"] = max(3 * interval, 2 * interval + timeout)
    if parsed["prometheus_max_staleness"] is None:
        parsed["prometheus_max_staleness"] = parsed["max_staleness"] + PROMETHEUS_STALENESS_MARGIN
    elif parsed["prometheus_url"] is None:  # given, for a source that is not there (as its siblings)
        raise SettingsError("--prometheus-max-staleness needs --prometheus-url")
    for staleness in ("max_staleness", "prometheus_max_staleness"):
        # Data older than this is never used: at or under the scrape interval, every page would be stale
        # before the next one came, and every trigger UNAVAILABLE for ever.
        if parsed[staleness] <= parsed["scrape_interval"]:
            raise SettingsError(
                f"--{staleness.replace('_', '-')}={parsed[staleness]:g} must exceed"
                f" --scrape-interval={parsed['scrape_interval']:g}: data older than it is never used"
            )
    if (parsed["tls_cert_file"] is None) != (parsed["tls_key_file"] is None):
        raise SettingsError("--tls-cert-file and --tls-key-file must be given together")
    if parsed["tls_client_ca_file"] is not None and parsed["tls_cert_file"] is None:
        raise SettingsError("--tls-client-ca-file (mTLS) needs --tls-cert-file and --tls-key-file")
    _check_gateway_token(parsed)
    _check_prometheus(parsed)
    mode = parsed["kubernetes"]
    _check_mode(mode, parsed["inference_urls"], parsed["kubeconfig"], f"--kubernetes {mode}")
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
