"""charts/keda-gpu-scaler with the real Helm engine (helm-python-sdk): lint, render, validate every object,
agree with the kustomize base, carry every `serve` flag; its alerts and dashboard tested with promtool."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from crd_schemas import SCHEMAS
from support import kustomize_command

from keda_gpu_scaler.config.flags import FLAGS
from keda_gpu_scaler.config.settings import build_settings, env_values
from keda_gpu_scaler.core.selectors import DEFAULT_EXPORTER_SELECTORS
from keda_gpu_scaler.core.value_parsers import NumberParser

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (the dev extras) is not installed")

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "keda-gpu-scaler"
MANIFESTS = ROOT / "manifests"
RULES = CHART / "files" / "prometheus-rules.yaml"
DASHBOARD = CHART / "dashboards" / "keda-gpu-scaler.json"
sys.path.insert(0, str(ROOT / "scripts"))

import chart_dashboard  # noqa: E402
import chart_docs  # noqa: E402

RELEASE, NAMESPACE = "keda-gpu-scaler", "keda"
ENV_PREFIX = "KEDA_GPU_SCALER_"
KUBERNETES_VERSIONS = ("1.30.0", kubernetes_validate.utils.latest_version())


# --- Prometheus Operator objects: the fields the chart uses, strict like tests/crd_schemas.py ---------


def _object(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


_STRING = {"type": "string"}
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_DURATION = {
    "type": "string",
    "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
}
_METADATA = _object(
    {"name": _STRING, "namespace": _STRING, "labels": _STRING_MAP, "annotations": _STRING_MAP},
    ("name", "namespace"),
)
_SELECTOR = _object({"matchLabels": _STRING_MAP})
_RELABEL = {"type": "array", "items": {"type": "object"}}
_ENDPOINT = _object(
    {
        "port": _STRING,
        "path": _STRING,
        "scheme": {"enum": ["http", "https"]},
        "honorLabels": {"type": "boolean"},
        "interval": _DURATION,
        "scrapeTimeout": _DURATION,
        "relabelings": _RELABEL,
        "metricRelabelings": _RELABEL,
    },
    ("port",),
)
_NAMESPACE_SELECTOR = _object({"matchNames": {"type": "array", "items": _STRING}})


def _monitor(kind: str, endpoints: str, extra: dict[str, Any]) -> dict[str, Any]:
    return _object(
        {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": kind},
            "metadata": _METADATA,
            "spec": _object(
                {
                    "selector": _SELECTOR,
                    "namespaceSelector": _NAMESPACE_SELECTOR,
                    endpoints: {"type": "array", "minItems": 1, "items": _ENDPOINT},
                    **extra,
                },
                ("selector", endpoints),
            ),
        },
        ("apiVersion", "kind", "metadata", "spec"),
    )


_RULE = {
    "oneOf": [
        _object(
            {
                "alert": _STRING,
                "expr": _STRING,
                "for": _DURATION,
                "labels": _STRING_MAP,
                "annotations": _STRING_MAP,
            },
            ("alert", "expr"),
        ),
        _object({"record": _STRING, "expr": _STRING, "labels": _STRING_MAP}, ("record", "expr")),
    ]
}
MONITORING_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): _monitor(
        "ServiceMonitor",
        "endpoints",
        {"jobLabel": _STRING, "targetLabels": {"type": "array", "items": _STRING}},
    ),
    ("monitoring.coreos.com/v1", "PodMonitor"): _monitor("PodMonitor", "podMetricsEndpoints", {}),
    ("monitoring.coreos.com/v1", "PrometheusRule"): _object(
        {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": "PrometheusRule"},
            "metadata": _METADATA,
            "spec": _object(
                {
                    "groups": {
                        "type": "array",
                        "minItems": 1,
                        "items": _object(
                            {"name": _STRING, "rules": {"type": "array", "minItems": 1, "items": _RULE}},
                            ("name", "rules"),
                        ),
                    }
                },
                ("groups",),
            ),
        },
        ("apiVersion", "kind", "metadata", "spec"),
    ),
}


def validate(doc: dict[str, Any]) -> None:
    schema = SCHEMAS.get((doc["apiVersion"], doc["kind"])) or MONITORING_SCHEMAS.get(
        (doc["apiVersion"], doc["kind"])
    )
    if schema is not None:
        jsonschema.validate(doc, schema)
        return
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


# --- rendering -----------------------------------------------------------------------------------------


def render_files(
    values: dict[str, Any] | None = None, name: str = RELEASE, namespace: str = NAMESPACE
) -> dict[str, str]:
    with helm.Chart.load(str(CHART)) as chart:
        rendered: dict[str, str] = chart.render(values or {}, name=name, namespace=namespace, is_install=True)
    return rendered


def render(
    values: dict[str, Any] | None = None, name: str = RELEASE, namespace: str = NAMESPACE
) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path, text in sorted(render_files(values, name, namespace).items()):
        if path.endswith(".yaml"):
            docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(matches) == 1, f"{kind} {name}: {len(matches)} found"
    return matches[0]


def kinds(docs: list[dict[str, Any]]) -> list[str]:
    return sorted(d["kind"] for d in docs)


def scaler(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = find(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def env(docs: list[dict[str, Any]]) -> dict[str, str]:
    found: dict[str, str] = {}
    for item in scaler(docs)["env"]:
        assert item["name"] not in found, f"{item['name']} twice"
        found[item["name"]] = item.get("value", "")
    return found


def kustomize(directory: Path) -> list[dict[str, Any]]:
    command = kustomize_command(directory)
    if command is None:
        pytest.skip("neither kustomize nor kubectl (with its built-in kustomize) is installed")
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def kustomize_with(
    tmp_path: Path, resources: list[Path], components: list[Path] = ()
) -> list[dict[str, Any]]:  # type: ignore[assignment]
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(p, tmp_path) for p in resources],
                "components": [os.path.relpath(p, tmp_path) for p in components],
            }
        )
    )
    return kustomize(tmp_path)


# Every option on at once: every object kind the chart can make, every flag given.
FILE_FLAGS = {"kubeconfig", "exporterBearerTokenFile", "exporterCaFile", "prometheusBearerTokenFile"}
FLAG_SAMPLES: dict[str, Any] = {
    "exporterUrl": ["http://10.0.0.1:9400/metrics", "http://10.0.0.2:9400/metrics"],
    "inferenceUrl": ["llm/vllm-0=http://10.0.0.5:8000/metrics", "llm/vllm-1=http://10.0.0.6:8000/metrics"],
    "prometheusHeader": ["X-Scope-OrgID: team-a", "X-Other: b"],
    "kubernetes": "on",  # the chart's default: off renders no RBAC (test_kubernetes_off_renders_no_rbac)
    "prometheusUrl": "http://prometheus.monitoring:9090",
    "prometheusUsername": "scaler",
    "scrapeInterval": 2.5,
    "maxPageBytes": 16777216,
    "maxStreams": 500,
}


def flag_sample(flag: Any) -> Any:
    name = chart_docs.value_name(flag)
    if name in FLAG_SAMPLES:
        return FLAG_SAMPLES[name]
    if flag.choices:
        return flag.choices[-1] if flag.choices[-1] != flag.default else flag.choices[0]
    if flag.repeatable:
        return ["a", "b"]
    if flag.name.endswith("-file"):
        return f"/etc/keda-gpu-scaler/secrets/{name}"
    if isinstance(flag.parse, NumberParser):
        return 7
    return "7"


# Read without Kubernetes only, which "everything" has on: test_rendered_flags_build_the_settings_they_say
# renders it with Kubernetes off.
WITHOUT_KUBERNETES = {"inferenceUrl"}


def all_flags() -> dict[str, Any]:
    flags = (
        flag for flag in chart_docs.chart_flags() if chart_docs.value_name(flag) not in WITHOUT_KUBERNETES
    )
    return {chart_docs.value_name(flag): flag_sample(flag) for flag in flags}


EVERYTHING: dict[str, Any] = {
    "image": {"repository": "registry.example.com/keda-gpu-scaler", "tag": "1.2.3", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "regcred"}],
    "replicaCount": 3,
    "additionalLabels": {"team": "platform"},
    "deploymentAnnotations": {"a": "b"},
    "podLabels": {"c": "d"},
    "podAnnotations": {"e": "f"},
    "priorityClassName": "system-cluster-critical",
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}]
            }
        }
    },
    "topologySpreadConstraints": [
        {
            "maxSkew": 1,
            "topologyKey": "topology.kubernetes.io/zone",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "keda-gpu-scaler"}},
        }
    ],
    "service": {"grpcPort": 7000, "httpPort": 9090, "annotations": {"x": "y"}},
    "serviceAccount": {"name": "gpu-scaler", "annotations": {"iam": "role"}},
    "rbac": {
        "namespaces": ["llm", "genai"],
        "scaleTargets": [{"apiGroups": ["apps"], "resources": ["deployments/scale"]}],
    },
    "explain": {"enabled": True},
    "exporterSelectors": {"additional": ["app=custom-exporter:9500"], "ack": {"enabled": True}},
    "tls": {"enabled": True, "certManager": {"enabled": True}},
    "prometheusPasswordSecret": {"name": "prom-auth"},
    "extraEnv": [{"name": "TZ", "value": "UTC"}],
    "extraVolumes": [{"name": "secrets", "secret": {"secretName": "scaler-secrets"}}],
    "extraVolumeMounts": [{"name": "secrets", "mountPath": "/etc/keda-gpu-scaler/secrets", "readOnly": True}],
    "flags": all_flags(),
    "networkPolicy": {
        "enabled": True,
        "additionalIngress": [{"ports": [{"port": "http"}], "from": [{"podSelector": {}}]}],
    },
    "tenantNetworkPolicy": {
        "enabled": True,
        "namespaces": [
            {"namespace": "llm", "ports": [{"port": 8000, "protocol": "TCP"}]},
            {
                "namespace": "gpu-operator",
                "ports": [{"port": 9400}],
                "podSelector": {"matchLabels": {"app": "nvidia-dcgm-exporter"}},
            },
        ],
    },
    "podDisruptionBudget": {"maxUnavailable": 1},
    "gateway": {"metricsToken": {"enabled": True, "plainHTTP": True}},
    "prometheus": {
        "serviceMonitor": {
            "enabled": True,
            "namespace": "monitoring",
            "interval": "15s",
            "scrapeTimeout": "10s",
            "additionalLabels": {"release": "kube-prometheus-stack"},
            "relabelings": [{"action": "replace", "targetLabel": "cluster", "replacement": "prod"}],
            "metricRelabelings": [{"action": "drop", "sourceLabels": ["__name__"], "regex": "nothing"}],
            "targetLabels": ["team"],
            "jobLabel": "app.kubernetes.io/name",
        },
        "podMonitor": {
            "enabled": True,
            "interval": "30s",
            "scrapeTimeout": "5s",
            "additionalLabels": {"a": "b"},
        },
        "rules": {
            "enabled": True,
            "namespace": "monitoring",
            "additionalLabels": {"release": "kube-prometheus-stack"},
            "disabled": ["KedaGpuScalerReplicaDown"],
            "alertLabels": {"team": "platform"},
            "additionalRules": [{"alert": "Custom", "expr": "vector(1)", "for": "1m"}],
        },
    },
    "dashboards": {"enabled": True, "annotations": {"grafana_folder": "KEDA"}},
}


@pytest.fixture(scope="module")
def defaults() -> list[dict[str, Any]]:
    return render()


@pytest.fixture(scope="module")
def everything() -> list[dict[str, Any]]:
    return render(EVERYTHING)


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return kustomize(MANIFESTS / "base")


# --- lint, schema, validation ----------------------------------------------------------------------------


@pytest.mark.parametrize("values", [{}, EVERYTHING], ids=["defaults", "everything"])
def test_chart_lints_clean(values: dict[str, Any]) -> None:
    for version in KUBERNETES_VERSIONS:
        report = helm.lint(str(CHART), values, strict=True, namespace=NAMESPACE, kube_version=f"v{version}")
        # Severity 1 is informational (e.g. "icon is recommended"); warnings and errors fail.
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert not problems and not report["errors"], problems or report["errors"]


def test_defaults_render_and_validate(defaults: list[dict[str, Any]]) -> None:
    assert kinds(defaults) == sorted(
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "Deployment",
            "PodDisruptionBudget",
            "Service",
            "Service",
            "ServiceAccount",
        ]
    )
    for doc in defaults:
        validate(doc)
    namespaced = [d for d in defaults if not d["kind"].startswith("Cluster")]
    assert {d["metadata"]["namespace"] for d in namespaced} == {NAMESPACE}


def test_every_option_renders_and_validates(everything: list[dict[str, Any]]) -> None:
    for doc in everything:
        validate(doc)
    assert set(kinds(everything)) == {
        "Certificate", "ClusterRole", "ClusterRoleBinding", "ClusterTriggerAuthentication", "ConfigMap",
        "Deployment", "Issuer", "NetworkPolicy", "PodDisruptionBudget", "PodMonitor", "PrometheusRule",
        "Role", "RoleBinding", "Service", "ServiceAccount", "ServiceMonitor",
    }  # fmt: skip


@pytest.mark.parametrize(
    "values",
    [
        {"tls": {"enabled": True, "existingSecret": "my-tls", "mtls": {"enabled": False}}},
        {
            "tls": {
                "enabled": True,
                "certManager": {"enabled": True, "issuerRef": {"kind": "ClusterIssuer", "name": "ca"}},
            }
        },
        {"rbac": {"namespaces": ["llm"], "exporterDiscovery": False}},
        {"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "keda-operator"}},
        {
            "service": {"headless": {"enabled": False}},
            "podDisruptionBudget": {"enabled": False},
            "replicaCount": 1,
        },
        {"fullnameOverride": "gpu"},
    ],
    ids=["tls-secret", "tls-issuer", "rbac-namespaced", "no-rbac", "minimal", "fullname"],
)
def test_variants_render_and_validate(values: dict[str, Any]) -> None:
    for doc in render(values):
        validate(doc)


@pytest.mark.parametrize(
    "values",
    [
        {"replicaCont": 2},
        {"flags": {"scrapeIntervall": 5}},
        {"flags": {"logLevel": "verbose"}},
        {"service": {"grpcPort": "6000"}},
        {"prometheus": {"serviceMonitor": {"enable": True}}},
        {"networkPolicy": {"grpcFrom": []}},  # an empty `from` would admit everyone
        {"tenantNetworkPolicy": {"namespaces": [{"namespace": "llm"}]}},  # no port: it would open every one
        {"rbac": {"scaleTargets": [{"apiGroups": ["apps"], "resources": ["deployments"]}]}},
    ],
    ids=[
        "top-level",
        "flag",
        "flag-choice",
        "port-type",
        "nested",
        "open-policy",
        "tenant-policy-ports",
        "scale-only",
    ],
)
def test_schema_rejects_typos_and_bad_values(values: dict[str, Any]) -> None:
    with helm.Chart.load(str(CHART)) as chart, pytest.raises(helm.HelmValuesError):
        chart.validate_schema(values)
    with pytest.raises(helm.HelmValuesError):
        render_files(values)


# Values of the right type the scaler would still refuse at start (a crash loop): the generated schema
# carries each number flag's parser's type and range (scripts/chart_docs.py).
REFUSED_AT_START = {
    "scrape-interval-0": {"scrapeInterval": 0},
    "scrape-interval-under": {"scrapeInterval": 0.05},
    "scrape-interval-over": {"scrapeInterval": 600},
    "max-streams-text": {"maxStreams": "many"},
    "max-streams-fraction": {"maxStreams": 1.5},
    "max-streams-0": {"maxStreams": 0},
    "scrape-timeout-negative": {"scrapeTimeout": -1},
    "discovery-interval-0": {"discoveryInterval": 0},
    "keepalive-time-over": {"keepaliveTime": 3000000},
    "number-as-text": {"scrapeTimeout": "3"},
}


@pytest.mark.parametrize("flags", REFUSED_AT_START.values(), ids=REFUSED_AT_START.keys())
def test_schema_refuses_flag_values_the_scaler_refuses_at_start(flags: dict[str, Any]) -> None:
    with helm.Chart.load(str(CHART)) as chart, pytest.raises(helm.HelmValuesError):
        chart.validate_schema({"flags": flags})


def test_schema_takes_the_range_ends_the_scaler_takes() -> None:
    flags = {"scrapeInterval": 0.1, "maxStaleness": 300, "keepaliveTime": 0.001, "maxStreams": 1}
    settings = build_settings(env_values(env(render({"flags": flags}))))
    assert (settings.scrape_interval, settings.keepalive_time, settings.max_streams) == (0.1, 0.001, 1)
    flags = {"scrapeInterval": 300, "maxStaleness": 301, "keepaliveTime": 2147483, "maxStreams": 1e6}
    settings = build_settings(env_values(env(render({"flags": flags}))))
    assert (settings.scrape_interval, settings.keepalive_time, settings.max_streams) == (300, 2147483, 10**6)


def test_inference_urls_render_with_kubernetes_auto_where_no_token_is_mounted() -> None:
    # auto resolves to off in a pod without a service account token: the scaler reads --inference-url.
    url = "llm/vllm-0=http://10.0.0.5:8000/metrics"
    values = {
        "flags": {"kubernetes": "auto", "inferenceUrl": [url]},
        "serviceAccount": {"automountServiceAccountToken": False},
    }
    assert env(render(values))[f"{ENV_PREFIX}INFERENCE_URL"] == url
    with pytest.raises(helm.HelmError, match=r"flags\.inferenceUrl is read without"):
        render_files({"flags": {"kubernetes": "auto", "inferenceUrl": [url]}})  # a token mounted: on


@pytest.mark.parametrize("flags", [{"prometheusUrl": ""}, {"prometheusHeader": []}])
def test_an_empty_prometheus_flag_without_a_url_renders(flags: dict[str, Any]) -> None:
    # `--set flags.prometheusUrl=` switches it off; an empty header list is no header: the scaler starts.
    render_files({"flags": flags})


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        ({"maxStaleness": 5}, r"flags\.maxStaleness=5 must exceed flags\.scrapeInterval \(5\)"),
        ({"scrapeInterval": 10, "maxStaleness": 8}, r"flags\.maxStaleness=8 must exceed"),
        ({"defaultSource": "prometheus"}, r"flags\.defaultSource=prometheus needs flags\.prometheusUrl"),
        ({"prometheusMaxStaleness": 120}, r"flags\.prometheusMaxStaleness needs flags\.prometheusUrl"),
        ({"prometheusTimeout": 10}, r"flags\.prometheusTimeout needs flags\.prometheusUrl"),
        (
            {"inferenceUrl": ["llm/vllm-0=http://10.0.0.5:8000/metrics"]},
            r"flags\.inferenceUrl is read without",
        ),
        ({"kubernetes": "off", "kubeconfig": "/k"}, r"flags\.kubeconfig is read with Kubernetes only"),
        ({"prometheusHeader": ["X-Scope-OrgID: a"]}, r"flags\.prometheusHeader needs flags\.prometheusUrl"),
    ],
)
def test_flags_the_scaler_refuses_together_stop_the_render(flags: dict[str, Any], words: str) -> None:
    # The scaler refuses these at start (config/settings.py): installed, every replica crash-looped.
    with pytest.raises(helm.HelmError, match=words):
        render_files({"flags": flags})
    (interval,) = [flag for flag in FLAGS if flag.name == "--scrape-interval"]
    assert interval.default == "5"  # the chart's template assumes it


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (
            {"prometheusUrl": "http://prometheus.monitoring:9090"},
            r"prom-auth.*needs flags\.prometheusUsername",
        ),
        ({"prometheusUsername": "scaler"}, r"prom-auth needs flags\.prometheusUrl"),
    ],
    ids=["no-username", "no-url"],
)
def test_a_prometheus_password_without_its_user_or_url_stops_the_render(
    flags: dict[str, Any], words: str
) -> None:
    values = {"flags": flags, "prometheusPasswordSecret": {"name": "prom-auth"}}
    with pytest.raises(helm.HelmError, match=rf"prometheusPasswordSecret\.name={words}"):
        render_files(values)
    # With both, the password reaches the scaler from the Secret.
    flags = {"prometheusUrl": "http://prometheus.monitoring:9090", "prometheusUsername": "scaler"}
    given = env(render({"flags": flags, "prometheusPasswordSecret": {"name": "prom-auth"}}))
    given[f"{ENV_PREFIX}PROMETHEUS_PASSWORD"] = "from-the-secret"
    assert build_settings(env_values(given)).prometheus_username == "scaler"


def test_tls_needs_a_certificate_source() -> None:
    with pytest.raises(helm.HelmError, match=r"tls\.existingSecret"):
        render_files({"tls": {"enabled": True}})


# --- flags -----------------------------------------------------------------------------------------------


def test_every_flag_has_a_chart_value() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart_values = set(values["flags"])
    for flag in FLAGS:
        if flag.name in chart_docs.STRUCTURED:
            path = chart_docs.STRUCTURED[flag.name].split(".")
            node = values
            for part in path:
                assert part in node, f"{flag.name}: no value {chart_docs.STRUCTURED[flag.name]}"
                node = node[part]
        else:
            assert chart_docs.value_name(flag) in chart_values, (
                f"{flag.name} has no value flags.{chart_docs.value_name(flag)}"
            )
    assert chart_values == {chart_docs.value_name(f) for f in chart_docs.chart_flags()}


def test_only_flags_given_are_rendered(defaults: list[dict[str, Any]]) -> None:
    given = env(defaults)
    assert set(given) == {
        f"{ENV_PREFIX}{n}" for n in ("GRPC_ADDRESS", "HTTP_ADDRESS", "KUBERNETES", "LOG_FORMAT")
    }


def test_every_flag_reaches_the_scaler(everything: list[dict[str, Any]]) -> None:
    given = env(everything)
    for flag in FLAGS:
        if flag.name == "--gateway-token-file":
            continue  # gateway.metricsToken.mode secret's, the alternative to minting: test_chart_gateway.py
        if flag.name == "--inference-url":
            continue  # without Kubernetes only: test_rendered_flags_build_the_settings_they_say
        assert flag.env in given, f"{flag.name}: {flag.env} not rendered"
    known = {flag.env for flag in FLAGS} | {f"{ENV_PREFIX}PROMETHEUS_PASSWORD"}
    assert {n for n in given if n.startswith(ENV_PREFIX)} <= known
    # What the scaler reads back from the environment is what the values said.
    parsed = env_values(given)
    for flag in chart_docs.chart_flags():
        if chart_docs.value_name(flag) in WITHOUT_KUBERNETES:
            continue
        sample = flag_sample(flag)
        raw = parsed[flag.dest]
        if flag.repeatable:
            (text,) = raw
            separator = {"prometheus_header": "\n", "exporter_selector": ";"}.get(flag.dest, ",")
            assert text.split(separator) == sample, flag.name
        else:
            assert raw == (str(sample) if not isinstance(sample, float) else f"{sample:g}"), flag.name
    assert given[f"{ENV_PREFIX}MAX_PAGE_BYTES"] == "16777216"  # not 1.6777216e+07
    assert given[f"{ENV_PREFIX}GRPC_ADDRESS"] == "0.0.0.0:7000"
    assert given[f"{ENV_PREFIX}HTTP_ADDRESS"] == "0.0.0.0:9090"
    assert given[f"{ENV_PREFIX}EXPLAIN"] == "on"
    password = next(e for e in scaler(everything)["env"] if e["name"] == f"{ENV_PREFIX}PROMETHEUS_PASSWORD")
    assert password["valueFrom"]["secretKeyRef"] == {"name": "prom-auth", "key": "password"}


def test_rendered_flags_build_the_settings_they_say(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    flags = {
        "exporterUrl": FLAG_SAMPLES["exporterUrl"],
        "inferenceUrl": FLAG_SAMPLES["inferenceUrl"],
        "kubernetes": "off",  # the pages --inference-url gives are read without Kubernetes only
        "scrapeInterval": 2.5,
        "maxPageBytes": 16777216,
        "maxScaledobjects": 100,
        "prometheusUrl": "http://prometheus.monitoring:9090",
        "prometheusHeader": FLAG_SAMPLES["prometheusHeader"],
        "prometheusBearerTokenFile": str(token),
        "exporterBearerTokenFile": str(token),
        "logLevel": "debug",
    }
    settings = build_settings(env_values(env(render({"flags": flags}))))
    assert settings.exporter_urls == tuple(flags["exporterUrl"])
    assert [f"{ns}/{pod}={url}" for ns, pod, url in settings.inference_urls] == flags["inferenceUrl"]
    assert settings.scrape_interval == 2.5 and settings.max_page_bytes == 16777216
    assert settings.max_scaledobjects == 100 and settings.log_level == "debug"
    assert settings.prometheus_headers == (("X-Scope-OrgID", "team-a"), ("X-Other", "b"))
    assert settings.exporter_bearer_token_file == token and settings.prometheus_bearer_token_file == token
    assert settings.kubernetes == "off" and settings.log_format == "json" and settings.explain is False
    assert settings.grpc_address == "0.0.0.0:6000" and settings.http_address == "0.0.0.0:8080"


def test_exporter_selectors() -> None:
    def selectors(values: dict[str, Any]) -> list[str] | None:
        value = env(render({"exporterSelectors": values})).get(f"{ENV_PREFIX}EXPORTER_SELECTOR")
        return None if value is None else value.split(";")

    defaults = list(DEFAULT_EXPORTER_SELECTORS)
    assert selectors({}) is None  # the scaler's own defaults
    ack = yaml.safe_load((CHART / "values.yaml").read_text())["exporterSelectors"]["ack"]["selector"]
    assert selectors({"ack": {"enabled": True}}) == [*defaults, ack]
    assert selectors({"additional": ["app=x:1"]}) == [*defaults, "app=x:1"]
    assert selectors({"override": ["app=y"], "ack": {"enabled": True}}) == ["app=y", ack]
    # The ACK example's kustomization names the same selector in its comment.
    assert ack in (MANIFESTS / "examples" / "ack-shared-gpu" / "kustomization.yaml").read_text()
    build_settings(env_values({f"{ENV_PREFIX}EXPORTER_SELECTOR": ";".join([*defaults, ack])}))


def test_explain_is_off_unless_asked(defaults: list[dict[str, Any]]) -> None:
    flag = next(f for f in FLAGS if f.name == "--explain")
    assert flag.default == "off"
    assert env(defaults).get(flag.env, flag.default) == "off"
    assert yaml.safe_load((CHART / "values.yaml").read_text())["explain"] == {"enabled": False}
    assert env(render({"explain": {"enabled": True}}))[flag.env] == "on"


# --- the chart and the kustomize base agree ---------------------------------------------------------------


def _effective(variables: dict[str, str]) -> dict[str, Any]:
    """Every flag's value as the scaler would see it: the environment, else the flag's default."""
    return {flag.name: variables.get(flag.env, flag.default) for flag in FLAGS}


def _grants(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    """(API group, resource, verb) of every rule; a non-resource URL reads as group "(url)"."""
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group, resources in (
            [("(url)", rule["nonResourceURLs"])]
            if "nonResourceURLs" in rule
            else [(g, rule["resources"]) for g in rule["apiGroups"]]
        )
        for resource in resources
        for verb in rule["verbs"]
    }


GATEWAY_GRANTS = {
    ("inference.networking.k8s.io", "inferencepools", "list"),
    ("inference.networking.k8s.io", "inferencepools", "watch"),
    ("", "services", "list"),
    ("", "services", "watch"),
}


def test_chart_and_kustomize_base_agree(defaults: list[dict[str, Any]], base: list[dict[str, Any]]) -> None:
    chart_pod = find(defaults, "Deployment")["spec"]["template"]["spec"]
    base_pod = find(base, "Deployment")["spec"]["template"]["spec"]
    assert find(defaults, "Deployment")["spec"]["replicas"] == find(base, "Deployment")["spec"]["replicas"]
    for key in ("securityContext", "terminationGracePeriodSeconds", "volumes"):
        assert chart_pod[key] == base_pod[key], key
    assert chart_pod["affinity"]["podAntiAffinity"].keys() == base_pod["affinity"]["podAntiAffinity"].keys()
    (chart_c,) = chart_pod["containers"]
    (base_c,) = base_pod["containers"]
    for key in (
        "name", "image", "imagePullPolicy", "command", "args", "ports", "livenessProbe", "readinessProbe",
        "resources", "securityContext", "volumeMounts",
    ):  # fmt: skip
        assert chart_c[key] == base_c[key], key
    assert _effective(env(defaults)) == _effective({e["name"]: e["value"] for e in base_c["env"]})
    for name in ("keda-gpu-scaler", "keda-gpu-scaler-headless"):
        chart_svc, base_svc = find(defaults, "Service", name)["spec"], find(base, "Service", name)["spec"]
        assert chart_svc["ports"] == base_svc["ports"], name
        assert chart_svc.get("clusterIP") == base_svc.get("clusterIP")
    assert _grants(find(defaults, "ClusterRole")) == _grants(find(base, "ClusterRole"))
    assert (
        find(defaults, "PodDisruptionBudget")["spec"]["minAvailable"]
        == find(base, "PodDisruptionBudget")["spec"]["minAvailable"]
    )
    binding = find(defaults, "ClusterRoleBinding")
    assert binding["subjects"] == find(base, "ClusterRoleBinding")["subjects"]


def _by_name(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in items}


def test_chart_tls_agrees_with_the_tls_overlay() -> None:
    chart = render({"tls": {"enabled": True, "certManager": {"enabled": True}}})
    overlay = kustomize(MANIFESTS / "overlays" / "tls")
    chart_c, overlay_c = scaler(chart), scaler(overlay)
    for key in ("livenessProbe", "readinessProbe"):
        assert chart_c[key] == overlay_c[key], key
    assert _by_name(chart_c["volumeMounts"]) == _by_name(overlay_c["volumeMounts"])
    tls_env = {n: v for n, v in env(chart).items() if "TLS" in n}
    assert tls_env == {e["name"]: e["value"] for e in overlay_c["env"] if "TLS" in e["name"]}
    volumes = find(chart, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert _by_name(volumes) == _by_name(find(overlay, "Deployment")["spec"]["template"]["spec"]["volumes"])
    # The gRPC ports speak TLS: appProtocol https on both Services, in both.
    for name in ("keda-gpu-scaler", "keda-gpu-scaler-headless"):
        chart_ports = find(chart, "Service", name)["spec"]["ports"]
        assert find(overlay, "Service", name)["spec"]["ports"] == chart_ports, name
        assert _by_name(chart_ports)["grpc"]["appProtocol"] == "https", name
    for kind, name in (
        ("Certificate", "keda-gpu-scaler-server"),
        ("Certificate", "keda-gpu-scaler-client"),
        ("ClusterTriggerAuthentication", "keda-gpu-scaler-mtls"),
    ):
        chart_spec = find(chart, kind, name)["spec"]
        overlay_spec = find(overlay, kind, name)["spec"]
        if kind == "Certificate":
            assert set(overlay_spec.get("dnsNames", [])) == set(chart_spec.get("dnsNames", []))
            chart_spec = {k: v for k, v in chart_spec.items() if k not in ("dnsNames", "issuerRef")}
            overlay_spec = {k: v for k, v in overlay_spec.items() if k not in ("dnsNames", "issuerRef")}
        assert chart_spec == overlay_spec, name


def test_tls_without_mtls_gives_keda_the_ca_that_signed_the_server_certificate() -> None:
    # KEDA speaks TLS to an external scaler only with a caCert (or enableTLS, against the system CAs): the
    # chart's private CA reached KEDA only under mTLS, and its NOTES printed triggers without a reference.
    values = {"tls": {"enabled": True, "mtls": {"enabled": False}, "certManager": {"enabled": True}}}
    docs = render(values)
    assert [d for d in docs if d["kind"] == "Certificate" and d["metadata"]["name"].endswith("-client")] == []
    refs = find(docs, "ClusterTriggerAuthentication", "keda-gpu-scaler-tls")["spec"]["secretTargetRef"]
    server = find(docs, "Certificate", "keda-gpu-scaler-server")["spec"]["secretName"]
    assert refs == [{"parameter": "caCert", "name": server, "key": "ca.crt"}]
    notes = render_files(values)[f"{CHART.name}/templates/NOTES.txt"]
    assert notes.count("name: keda-gpu-scaler-tls") == notes.count("scalerAddress:") > 0


def test_network_policy_chart_and_component_agree(tmp_path: Path) -> None:
    chart = find(render({"networkPolicy": {"enabled": True}}), "NetworkPolicy")
    docs = kustomize_with(tmp_path, [MANIFESTS / "base"], [MANIFESTS / "components" / "network-policy"])
    for doc in docs:
        validate(doc)
    component = find(docs, "NetworkPolicy")
    assert chart["spec"]["ingress"] == component["spec"]["ingress"]
    assert chart["spec"]["policyTypes"] == component["spec"]["policyTypes"] == ["Ingress"]
    deployment = find(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert component["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    ports = {p["name"] for p in scaler(docs)["ports"]}
    assert {p["port"] for rule in component["spec"]["ingress"] for p in rule["ports"]} == ports
    (grpc_rule, http_rule) = component["spec"]["ingress"]
    assert [p["port"] for p in grpc_rule["ports"]] == ["grpc"]
    for peer in grpc_rule["from"]:
        assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "keda"}}
        assert peer["podSelector"]["matchLabels"] in (
            {"app": "keda-operator"},
            {"app.kubernetes.io/name": "keda-operator"},
        )
    assert http_rule["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]


def test_network_policy_selects_the_scaler_pods(everything: list[dict[str, Any]]) -> None:
    policy = find(everything, "NetworkPolicy", RELEASE)
    pod_labels = find(everything, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["ingress"][-1] == EVERYTHING["networkPolicy"]["additionalIngress"][0]


def test_tenant_network_policy_admits_the_scaler_pods_to_the_ports_it_reads(
    everything: list[dict[str, Any]],
) -> None:
    policies = {
        d["metadata"]["namespace"]: d
        for d in everything
        if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == f"{RELEASE}-scrape"
    }
    assert set(policies) == {"llm", "gpu-operator"}
    pod_labels = find(everything, "Deployment")["spec"]["template"]["metadata"]["labels"]
    for namespace, policy in policies.items():
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        (rule,) = policy["spec"]["ingress"]
        (peer,) = rule["from"]
        assert peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}
        assert peer["podSelector"]["matchLabels"].items() <= pod_labels.items()
        wanted = next(
            n for n in EVERYTHING["tenantNetworkPolicy"]["namespaces"] if n["namespace"] == namespace
        )
        assert rule["ports"] == wanted["ports"]
        assert policy["spec"]["podSelector"] == wanted.get("podSelector", {})


def test_tenant_network_policy_needs_its_namespaces() -> None:
    with pytest.raises(helm.HelmError, match=r"tenantNetworkPolicy\.namespaces"):
        render_files({"tenantNetworkPolicy": {"enabled": True}})


def test_the_tenant_policy_to_copy_in_the_docs_is_what_the_chart_renders() -> None:
    security = (ROOT / "docs" / "SECURITY.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", security, re.S)
    (documented,) = (
        yaml.safe_load(b) for b in blocks if "kind: NetworkPolicy" in b and f"{RELEASE}-scrape" in b
    )
    namespace = documented["metadata"]["namespace"]
    port_rule, *kept_open = documented["spec"]["ingress"]
    entry = {"namespace": namespace, "ports": port_rule["ports"], "additionalIngress": kept_open}
    rendered = find(
        render({"tenantNetworkPolicy": {"enabled": True, "namespaces": [entry]}}), "NetworkPolicy"
    )
    validate(documented)
    assert documented["spec"] == rendered["spec"]
    assert documented["metadata"]["name"] == rendered["metadata"]["name"]


# --- RBAC, monitors, examples --------------------------------------------------------------------------------


def test_rbac_namespaced(everything: list[dict[str, Any]], base: list[dict[str, Any]]) -> None:
    roles = {
        d["metadata"]["namespace"]: d
        for d in everything
        if d["kind"] == "Role" and not d["metadata"]["name"].endswith("-epp-metrics-token")  # minting's
    }
    assert set(roles) == {"llm", "genai"}
    for role in roles.values():
        assert (
            _grants(role)
            == {
                ("keda.sh", "scaledobjects", "get"),
                ("keda.sh", "scaledobjects", "list"),
                ("keda.sh", "scaledobjects", "watch"),
                ("apps", "deployments/scale", "get"),
                ("", "pods", "list"),
                ("", "pods", "watch"),
            }
            | GATEWAY_GRANTS
        )
    bindings = [
        d
        for d in everything
        if d["kind"] == "RoleBinding" and not d["metadata"]["name"].endswith("-epp-metrics-token")
    ]
    assert {b["metadata"]["namespace"] for b in bindings} == set(roles)
    for binding in bindings:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "gpu-scaler", "namespace": NAMESPACE}
        ]
    # Exporter discovery watches exporter pods in every namespace: only pods, only list and watch.
    assert _grants(find(everything, "ClusterRole", "keda-gpu-scaler-exporter-pods")) == {
        ("", "pods", "list"),
        ("", "pods", "watch"),
    }
    # Only a ClusterRole grants a non-resource URL: get /metrics, what the endpoint picker checks of the
    # scaler's own token. With gateway.metricsToken (as in everything) pickers never get that token.
    assert not [d for d in everything if d["metadata"]["name"] == "keda-gpu-scaler-gateway-metrics"]
    own_token = render({"rbac": {"namespaces": ["llm", "genai"]}, "serviceAccount": {"name": "gpu-scaler"}})
    assert _grants(find(own_token, "ClusterRole", "keda-gpu-scaler-gateway-metrics")) == {
        ("(url)", "/metrics", "get")
    }
    gateway_binding = find(own_token, "ClusterRoleBinding", "keda-gpu-scaler-gateway-metrics")
    assert gateway_binding["roleRef"]["name"] == "keda-gpu-scaler-gateway-metrics"
    assert gateway_binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpu-scaler", "namespace": NAMESPACE}
    ]
    narrow = render({"rbac": {"namespaces": ["llm"], "exporterDiscovery": False, "gateway": False}})
    assert not [d for d in narrow if d["kind"].startswith("Cluster")]
    assert not _grants(find(narrow, "Role")) & GATEWAY_GRANTS
    assert _grants(find(base, "ClusterRole")) >= _grants(roles["llm"]) - {
        ("apps", "deployments/scale", "get")
    }


def test_rbac_gateway_rules_follow_the_value(defaults: list[dict[str, Any]]) -> None:
    grants = _grants(find(defaults, "ClusterRole"))
    assert grants >= GATEWAY_GRANTS | {("(url)", "/metrics", "get")}
    without = _grants(find(render({"rbac": {"gateway": False}}), "ClusterRole"))
    assert without == grants - GATEWAY_GRANTS - {("(url)", "/metrics", "get")}


def test_service_monitor_and_pod_monitor_find_the_scaler(everything: list[dict[str, Any]]) -> None:
    service = find(everything, "Service", "keda-gpu-scaler")
    monitor = find(everything, "ServiceMonitor")
    assert monitor["metadata"]["namespace"] == "monitoring"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (
        endpoint["port"] in {p["name"] for p in service["spec"]["ports"]} and endpoint["path"] == "/metrics"
    )
    assert endpoint["honorLabels"] is True  # trigger series keep the ScaledObject's namespace label
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("15s", "10s")
    pod_monitor = find(everything, "PodMonitor")
    pod_labels = find(everything, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (pod_endpoint,) = pod_monitor["spec"]["podMetricsEndpoints"]
    assert pod_endpoint["port"] == "http" and pod_endpoint["honorLabels"] is True


@pytest.mark.parametrize("example", sorted((CHART / "examples").glob("*-values.yaml")), ids=lambda p: p.stem)
def test_example_values_install(example: Path) -> None:
    values = yaml.safe_load(example.read_text())
    assert (
        f"helm install {RELEASE} charts/keda-gpu-scaler -n {NAMESPACE} -f charts/keda-gpu-scaler/examples/{example.name}"
        in example.read_text()
    )
    report = helm.lint(str(CHART), values, strict=True, namespace=NAMESPACE)
    assert not report["errors"], report["errors"]
    docs = render(values)
    for doc in docs:
        validate(doc)
    # The examples' ScaledObjects name this release's Service.
    setup = {
        "aks": "aks-nvidia-gpu-operator",
        "doks": "doks-amd-mi300x",
        "ack": "ack-shared-gpu",
        "vllm": "vllm-llm-serving",
    }[example.stem.removesuffix("-values")]
    hosts = {
        find(docs, "Service", n)["metadata"]["name"] + "." + NAMESPACE
        for n in ("keda-gpu-scaler", "keda-gpu-scaler-headless")
    }
    for path in (MANIFESTS / "examples" / setup).glob("scaledobject*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            for trigger in doc["spec"]["triggers"]:
                if trigger["type"].startswith("external"):
                    assert trigger["metadata"]["scalerAddress"] in {f"{host}:6000" for host in hosts}
    if example.stem.startswith("ack"):
        assert "ack-prometheus-gpu-exporter" in env(docs)[f"{ENV_PREFIX}EXPORTER_SELECTOR"]
    # No example isolates a tenant's pods: a policy selecting them in a namespace without a default-deny
    # would cut the gateway's traffic (test_chart_gateway.py checks the values too).
    assert not [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-scrape")]


def test_notes_name_the_scaler_address() -> None:
    notes = render_files()["keda-gpu-scaler/templates/NOTES.txt"]
    assert (
        notes.count("scalerAddress: keda-gpu-scaler.keda:6000") == 3
    )  # the LLM sizing and guard, a GPU workload
    assert "metric: demand" in notes and "metric: utilization" in notes  # an LLM server, a GPU workload
    assert "port-forward" in notes
    # The default is the released image on ghcr.io; a repository without a registry is a local build.
    assert "ghcr.io/keda-gpu-scaler/keda-gpu-scaler:" in notes and "names no registry" not in notes
    local = render_files({"image": {"repository": "keda-gpu-scaler"}})["keda-gpu-scaler/templates/NOTES.txt"]
    assert "names no registry" in local and "make image" in local
    with_mtls = render_files({"tls": {"enabled": True, "certManager": {"enabled": True}}})
    assert with_mtls["keda-gpu-scaler/templates/NOTES.txt"].count("name: keda-gpu-scaler-mtls") == 3


# --- alerts and dashboard ------------------------------------------------------------------------------------


def _metric_types() -> dict[str, str]:
    """Every keda_gpu_scaler_* metric the code defines, by name: counter, gauge, histogram, summary."""
    found: dict[str, str] = {}
    pattern = re.compile(r'\b(Counter|Gauge|Histogram|Summary)\(\s*f"\{PREFIX\}_(\w+)"')
    for path in (ROOT / "keda_gpu_scaler").rglob("*.py"):
        for kind, name in pattern.findall(path.read_text()):
            found[f"keda_gpu_scaler_{name}"] = kind.lower()
    return found


def exported_series() -> set[str]:
    suffixes = {
        "counter": ("_total",),
        "gauge": ("",),
        "histogram": ("_bucket", "_sum", "_count"),
        "summary": ("_sum", "_count"),
    }
    return {name + suffix for name, kind in _metric_types().items() for suffix in suffixes[kind]}


def test_metric_inventory_matches_the_registry() -> None:
    from keda_gpu_scaler.telemetry import Telemetry

    registered = {metric.name for metric in Telemetry().registry.collect()}
    names = {n.removeprefix("keda_gpu_scaler_") for n in _metric_types()}
    assert {n.removeprefix("keda_gpu_scaler_") for n in registered} <= names


_PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or", "unless",
    "inf", "nan", "le",
}  # fmt: skip


def series_names(expr: str) -> set[str]:
    """Metric names of a PromQL expression: what is left once strings, label matchers, groupings, ranges,
    functions and keywords are taken out."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = match.group()
        following = text[match.end() :].lstrip()
        if following.startswith("(") or word.lower() in _PROMQL_WORDS:
            continue
        names.add(word)
    return names


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (Debian package prometheus; `make test` installs it as root)")
    return path


def check_rules(path: Path) -> None:
    done = subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def rule_file_rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def test_rules_file_is_valid_and_names_only_the_scalers_series() -> None:
    check_rules(RULES)
    known = exported_series() | {"up"}
    alerts = rule_file_rules()
    assert {r["alert"] for r in alerts} >= {
        "KedaGpuScalerDown", "KedaGpuScalerScrapeFailures", "KedaGpuScalerTriggersUnavailable",
        "KedaGpuScalerStreamsNearLimit", "KedaGpuScalerSlowCalls",
    }  # fmt: skip
    for rule in alerts:
        names = series_names(rule["expr"])
        assert names and names <= known, (rule["alert"], names - known)
        assert rule["labels"]["severity"] in ("critical", "warning")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def _annotations(rule: dict[str, Any], labels: dict[str, str]) -> dict[str, str]:
    def fill(text: str) -> str:
        return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), text)

    return {k: fill(v) for k, v in rule["annotations"].items()}


def _alert(name: str, labels: dict[str, str]) -> dict[str, Any]:
    rule = next(r for r in rule_file_rules() if r["alert"] == name)
    return {"exp_labels": {**labels, **rule["labels"]}, "exp_annotations": _annotations(rule, labels)}


TARGET = {
    "job": "keda-gpu-scaler",
    "instance": "10.0.0.7:8080",
    "namespace": "keda",
    "pod": "keda-gpu-scaler-0",
}


def _series(name: str, values: str, **labels: str) -> dict[str, str]:
    text = ",".join(f'{k}="{v}"' for k, v in {**TARGET, **labels}.items())
    return {"series": f"{name}{{{text}}}", "values": values}


# (alert, input series, evaluation time, fires) — each alert on synthetic series, firing and not.
ALERT_CASES: list[tuple[str, list[dict[str, str]], str, dict[str, str] | None]] = [
    ("KedaGpuScalerDown", [_series("up", "0x20")], "10m", {}),
    ("KedaGpuScalerDown", [_series("up", "1x20")], "10m", None),
    (
        "KedaGpuScalerDown",
        [_series("up", "1x20", instance="a"), _series("up", "0x20", instance="b")],
        "10m",
        None,
    ),
    ("KedaGpuScalerDown", [_series("other_job_up", "1x20")], "10m", {}),  # nothing scraped at all
    ("KedaGpuScalerReplicaDown", [_series("up", "0x20")], "15m", dict(TARGET)),
    ("KedaGpuScalerReplicaDown", [_series("up", "0x5 1x15")], "15m", None),
    (
        "KedaGpuScalerScrapeFailures",
        [
            _series("keda_gpu_scaler_scrapes_total", "0+60x30", result="ok"),
            _series("keda_gpu_scaler_scrapes_total", "0+20x30", result="error"),
        ],
        "20m",
        dict(TARGET),
    ),
    (
        "KedaGpuScalerScrapeFailures",
        [
            _series("keda_gpu_scaler_scrapes_total", "0+60x30", result="ok"),
            _series("keda_gpu_scaler_scrapes_total", "0+1x30", result="error"),
        ],
        "20m",
        None,
    ),
    (
        "KedaGpuScalerTriggersUnavailable",
        [_series("keda_gpu_scaler_rpc_requests_total", "0+4x30", method="GetMetrics", code="UNAVAILABLE")],
        "15m",
        dict(TARGET),
    ),
    (
        # Errors that stopped 10 minutes ago: resolved.
        "KedaGpuScalerTriggersUnavailable",
        [
            _series(
                "keda_gpu_scaler_rpc_requests_total", "0+4x5 20x25", method="GetMetrics", code="UNAVAILABLE"
            )
        ],
        "20m",
        None,
    ),
    (
        # A 3-minute gap in data is not yet an alert.
        "KedaGpuScalerTriggersUnavailable",
        [
            _series(
                "keda_gpu_scaler_rpc_requests_total",
                "0x10 0+4x3 12x20",
                method="IsActive",
                code="UNAVAILABLE",
            )
        ],
        "13m",
        None,
    ),
    (
        "KedaGpuScalerTriggersUnavailable",
        [_series("keda_gpu_scaler_rpc_requests_total", "0+40x30", method="GetMetrics", code="OK")],
        "15m",
        None,
    ),
    (
        "KedaGpuScalerStreamsNearLimit",
        [_series("keda_gpu_scaler_open_streams", "9500x20")],
        "10m",
        dict(TARGET),
    ),
    ("KedaGpuScalerStreamsNearLimit", [_series("keda_gpu_scaler_open_streams", "8000x20")], "10m", None),
    (
        "KedaGpuScalerScaledObjectsNearLimit",
        [_series("keda_gpu_scaler_scaledobjects_followed", "4800x30")],
        "20m",
        dict(TARGET),
    ),
    (
        "KedaGpuScalerScaledObjectsNearLimit",
        [_series("keda_gpu_scaler_scaledobjects_followed", "4800x10 100x20")],
        "20m",
        None,
    ),
    (
        "KedaGpuScalerSlowCalls",
        [
            _series("keda_gpu_scaler_rpc_duration_seconds_bucket", "0+10x30", method="GetMetrics", le="0.1"),
            _series(
                "keda_gpu_scaler_rpc_duration_seconds_bucket", "0+100x30", method="GetMetrics", le="0.25"
            ),
            _series(
                "keda_gpu_scaler_rpc_duration_seconds_bucket", "0+100x30", method="GetMetrics", le="+Inf"
            ),
        ],
        "20m",
        {**TARGET, "method": "GetMetrics"},
    ),
    (
        "KedaGpuScalerSlowCalls",
        [
            _series(
                "keda_gpu_scaler_rpc_duration_seconds_bucket", "0+100x30", method="GetMetrics", le="0.001"
            ),
            _series(
                "keda_gpu_scaler_rpc_duration_seconds_bucket", "0+100x30", method="GetMetrics", le="+Inf"
            ),
        ],
        "20m",
        None,
    ),
    (
        "KedaGpuScalerPrometheusQueryFailures",
        [
            _series("keda_gpu_scaler_prometheus_queries_total", "0+10x30", query="namespace", result="ok"),
            _series("keda_gpu_scaler_prometheus_queries_total", "0+10x30", query="namespace", result="error"),
        ],
        "20m",
        dict(TARGET),
    ),
    (
        "KedaGpuScalerKubernetesErrors",
        [_series("keda_gpu_scaler_kubernetes_watch_restarts_total", "0+1x40", reason="error")],
        "30m",
        dict(TARGET),
    ),
    (
        "KedaGpuScalerKubernetesErrors",
        [_series("keda_gpu_scaler_kubernetes_watch_restarts_total", "0+1x40", reason="gone")],
        "30m",
        None,
    ),
]


def test_every_alert_has_a_firing_case() -> None:
    assert {r["alert"] for r in rule_file_rules()} == {
        name for name, *_, fires in ALERT_CASES if fires is not None
    }


def test_alerts_fire_on_synthetic_series(tmp_path: Path) -> None:
    tests = []
    for name, series, at, fires in ALERT_CASES:
        expected = [] if fires is None else [_alert(name, fires)]
        tests.append(
            {
                "name": f"{name} at {at}: {'fires' if fires is not None else 'quiet'}",
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [{"eval_time": at, "alertname": name, "exp_alerts": expected}],
            }
        )
    spec = tmp_path / "rules_test.yaml"
    spec.write_text(
        yaml.safe_dump(
            {"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": tests}, sort_keys=False
        )
    )
    done = subprocess.run(
        [promtool(), "test", "rules", str(spec)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_chart_prometheus_rule_is_the_rules_file(tmp_path: Path) -> None:
    file_groups = yaml.safe_load(RULES.read_text())["groups"]
    rule = find(render({"prometheus": {"rules": {"enabled": True}}}), "PrometheusRule")
    validate(rule)
    assert rule["spec"]["groups"] == file_groups  # release keda-gpu-scaler: the same job regex, 10000 streams
    tuned = find(
        render(
            {
                "flags": {"maxStreams": 500, "maxScaledobjects": 100},
                "prometheus": {"rules": {"enabled": True, "jobRegex": "gpu", "alertLabels": {"team": "ml"}}},
            },
            name="gpu",
        ),
        "PrometheusRule",
    )
    rules = {r["alert"]: r for g in tuned["spec"]["groups"] for r in g["rules"]}
    assert rules["KedaGpuScalerStreamsNearLimit"]["expr"] == "keda_gpu_scaler_open_streams > 0.9 * 500"
    assert (
        rules["KedaGpuScalerScaledObjectsNearLimit"]["expr"]
        == "keda_gpu_scaler_scaledobjects_followed > 0.9 * 100"
    )
    assert rules["KedaGpuScalerDown"]["expr"] == 'absent(up{job=~"gpu"} == 1)'
    assert all(r["labels"]["team"] == "ml" and r["labels"]["severity"] for r in rules.values())
    everything = find(render(EVERYTHING), "PrometheusRule")
    names = [r["alert"] for g in everything["spec"]["groups"] for r in g["rules"]]
    assert "KedaGpuScalerReplicaDown" not in names and "Custom" in names
    for i, doc in enumerate((tuned, everything)):
        path = tmp_path / f"rules{i}.yaml"
        path.write_text(yaml.safe_dump({"groups": doc["spec"]["groups"]}))
        check_rules(path)


def dashboard_queries() -> Iterator[tuple[str, str]]:
    board = json.loads(DASHBOARD.read_text())
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            inner = re.fullmatch(r"label_values\((.*), *\w+\)", variable["query"]["query"])
            assert inner, variable["name"]
            yield f"variable {variable['name']}", inner.group(1)


def _grafana_to_promql(expr: str) -> str:
    return (
        expr.replace("$__rate_interval", "5m")
        .replace("$job", ".*")
        .replace("$namespace", ".*")
        .replace("$scaledobject", ".*")
    )


def test_dashboard_is_generated() -> None:
    assert DASHBOARD.read_text() == chart_dashboard.text(), "run: python scripts/chart_dashboard.py"


def test_dashboard_queries_parse_and_name_only_the_scalers_series(tmp_path: Path) -> None:
    known = exported_series()
    queries = list(dashboard_queries())
    assert len(queries) >= 15
    used: set[str] = set()
    for title, expr in queries:
        names = series_names(expr)
        assert names and names <= known, (title, names - known)
        used |= names
    assert len(used) >= 10
    path = tmp_path / "dashboard_rules.yaml"
    records = [
        {"record": f"dashboard:query{i}", "expr": _grafana_to_promql(e)} for i, (_, e) in enumerate(queries)
    ]
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]}))
    check_rules(path)


def test_dashboard_config_map(everything: list[dict[str, Any]]) -> None:
    config_map = find(everything, "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "KEDA"}
    assert json.loads(config_map["data"]["keda-gpu-scaler.json"]) == json.loads(DASHBOARD.read_text())


def test_series_names_reads_promql() -> None:
    assert series_names('sum by (a) (rate(x_total{y="b"}[5m])) / on (a) group_left z') == {"x_total", "z"}
    assert series_names('histogram_quantile(0.9, rate(h_bucket{le="+Inf"}[1m])) > 0.1') == {"h_bucket"}
    assert series_names('absent(up{job=~"sum(x)"} == 1)') == {"up"}


# --- generated documentation ---------------------------------------------------------------------------------


def test_values_docs_schema_and_readmes_are_generated() -> None:
    stale = [str(p.relative_to(ROOT)) for p, text in chart_docs.expected().items() if p.read_text() != text]
    assert not stale, f"out of date: {stale}; run `make chart-docs`"


def test_every_value_is_documented() -> None:
    text = (CHART / "values.yaml").read_text()
    rows = dict(chart_docs.documented_values(text))
    for flag in chart_docs.chart_flags():
        assert f"flags.{chart_docs.value_name(flag)}" in rows
    assert "explain.enabled" in rows and "networkPolicy.grpcFrom" in rows
    readme = (CHART / "README.md").read_text()
    for key in rows:
        assert f"| `{key}` |" in readme
    assert "charts/keda-gpu-scaler/README.md#values" in (ROOT / "README.md").read_text()


def test_readme_install_section_starts_with_helm_install_of_the_released_chart() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Install with Helm") :]
    first_command = next(line for line in section.splitlines() if line.startswith("helm "))
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert first_command == (
        f"helm install {RELEASE} oci://ghcr.io/keda-gpu-scaler/charts/keda-gpu-scaler"
        f" --version {chart['version']} -n {NAMESPACE}"
    )
    # A build of one's own goes in with the chart from the clone and the repository it was pushed to.
    own = readme[readme.index("### Your own build") :]
    assert f"helm install {RELEASE} charts/keda-gpu-scaler -n {NAMESPACE} --set image.repository=" in own


def test_everything_renders_every_template() -> None:
    # EVERYTHING names only values that exist (the schema would reject the render otherwise) and turns
    # every optional object on: no template is left unrendered.
    rendered = render_files(EVERYTHING)
    empty = [path for path, text in rendered.items() if path.endswith(".yaml") and not text.strip()]
    assert not empty, empty
