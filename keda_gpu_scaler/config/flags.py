"""The one table of `serve` flags: each flag's name, default, help, parser and Settings field. The CLI is built
from it, Settings takes its defaults from it, and docs/reference.md's table is checked against it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from keda_gpu_scaler.core.selectors import DEFAULT_EXPORTER_NAMESPACES, DEFAULT_EXPORTER_SELECTORS
from keda_gpu_scaler.core.value_parsers import (
    ENV_PREFIX,
    NumberParser,
    Parser,
    _address,
    _choice,
    _exporter_namespaces,
    _exporter_selectors,
    _gateway_urls,
    _grpc_seconds,
    _headers,
    _inference_urls,
    _path,
    _prometheus_url,
    _scrape_interval,
    _serviceaccount,
    _switch,
    _text,
    _token_path,
    _urls,
)


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


# The default staleness allows for a scrape's timeout (a page answered within it is never stale), so a
# timeout of 1e9 s kept a hung exporter's last page in use for ever: at most MAX_SCRAPE_TIMEOUT.
MAX_SCRAPE_TIMEOUT = 300.0
_scrape_timeout = NumberParser(float, None, MAX_SCRAPE_TIMEOUT, "seconds, more than 0 and at most 300")
# Faster than 0.1 s the loop spins against the API server (1 µs read /scale 2,347 times a second for one
# ScaledObject); slower than an hour, a target's replicas are that old.
_discovery_interval = NumberParser(float, 0.1, 3600.0, "seconds, 0.1 to 3600")

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
        " (environment: comma-separated). Replaces the discovery of exporter pods: with Kubernetes,"
        " --exporter-selector is then unused and no pod is listed outside the ScaledObjects' namespaces",
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
        "--exporter-namespaces",
        ",".join(DEFAULT_EXPORTER_NAMESPACES),
        "the namespaces GPU exporter pods are read from, ','-separated (the defaults are where the NVIDIA"
        " and AMD GPU operators and Alibaba ACK install them); with Kubernetes a pod elsewhere matching"
        " --exporter-selector is never read, and through Prometheus only series scraped from a target in"
        " them (or in the pod's own namespace, for inference servers' series) may name another namespace's pod"
        " (exported_namespace/exported_pod and the like): add a metrics proxy's namespace here. So a tenant"
        " cannot pass a pod of theirs off as a node's exporter or another tenant's server. * reads any namespace",
        parse=_exporter_namespaces,
    ),
    Flag(
        "--discovery-interval",
        "30",
        "seconds between re-reads of each followed scale target's /scale, and of a ScaledObject not found yet"
        " (followed ScaledObjects and pods are watched)",
        parse=_discovery_interval,
    ),
    Flag(
        "--scrape-interval",
        "5",
        "seconds between scrapes of each wanted exporter (0.1 to 300)",
        parse=_scrape_interval,
    ),
    Flag(
        "--max-staleness",
        None,
        "seconds after which data is not used (default: 3 x scrape interval, and at least 2 x scrape interval +"
        " scrape timeout, so that a page answered within the timeout is never stale)",
        parse=NumberParser(float),
    ),
    Flag(
        "--prometheus-max-staleness",
        None,
        "seconds after which data read from Prometheus is not used; it must exceed Prometheus' own scrape"
        " interval plus --scrape-interval (default: --max-staleness + 60)",
        parse=NumberParser(float),
    ),
    Flag(
        "--scrape-timeout",
        "3",
        "seconds an exporter may take to answer one scrape (at most 300)",
        parse=_scrape_timeout,
    ),
    Flag(
        "--max-page-bytes",
        "16777216",
        "largest exporter page or Prometheus answer accepted, in bytes",
        parse=NumberParser(int),
    ),
    Flag(
        "--scrape-concurrency",
        "64",
        "scrapes in flight at once per kind of page, shared fairly between namespaces: each namespace also has"
        " 2 of its own that no other can take, and uses at most half of these while another namespace wants one",
        parse=NumberParser(int),
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
        "seconds between scrapes of each wanted endpoint-picker page, 0.1 to 300 (the wake from zero follows"
        " within this); their data is stale after 2 intervals + --scrape-timeout",
        parse=_scrape_interval,
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
        "bearer tokens for endpoint pickers' metrics (llm-d's EPP asks for one by default), read again"
        " whenever they change: a directory with one file per namespace, named after it (its pickers get"
        " that one only), each a token of a ServiceAccount of its own whose only right is `get` on the"
        " non-resource URL /metrics (the chart's gateway.metricsToken); one file for every namespace only"
        " without Kubernetes. Sent over HTTPS, over plain HTTP only with --gateway-token-plain-http on"
        " (default: the scaler's own service account token, over verified HTTPS only)",
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
        parse=NumberParser(float),
    ),
    Flag(
        "--max-scaledobjects",
        "5000",
        "most ScaledObjects followed at once, each namespace with a fair share (the cap ÷ the namespaces"
        " followed); at the cap, one not called for 60 s (or --interest-ttl, if shorter) of the caller's"
        " namespace or of one above its share gives way, else a namespace below its share takes the least"
        " recently called of the largest namespace; a namespace at or above its share is RESOURCE_EXHAUSTED",
        parse=NumberParser(int),
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
    Flag("--prometheus-timeout", "5", "seconds one Prometheus query may take", parse=NumberParser(float)),
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
        " RESOURCE_EXHAUSTED); at the limit each namespace has a fair share, and one below it takes the newest"
        " stream of the namespace holding the most",
        parse=NumberParser(int),
    ),
    Flag(
        "--keepalive-time",
        "30",
        "seconds of silence on a gRPC connection after which the scaler pings the peer (KEDA sends no"
        " pings of its own)",
        parse=_grpc_seconds,
    ),
    Flag(
        "--keepalive-timeout",
        "10",
        "seconds a pinged peer has to answer before its connection (and its StreamIsActive streams) is dropped",
        parse=_grpc_seconds,
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
        parse=NumberParser(float),
    ),
    Flag("--log-level", "info", "log level", choices=("debug", "info", "warning", "error")),
    Flag("--log-format", "text", "log format", choices=("text", "json")),
)
