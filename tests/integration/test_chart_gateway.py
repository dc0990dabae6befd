"""The chart's endpoint-picker side: the limited identity whose token pickers get (gateway.metricsToken),
and the optional tenant NetworkPolicy keeping the gateway's own ports open."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (the dev extras) is not installed")

from test_chart import (  # noqa: E402
    CHART,
    ENV_PREFIX,
    NAMESPACE,
    RELEASE,
    _grants,
    env,
    find,
    render,
    render_files,
    scaler,
    validate,
)

from keda_gpu_scaler.settings import build_settings, env_values  # noqa: E402

TOKEN_SA = f"{RELEASE}-epp-metrics"
TOKEN_PATH = "/var/run/secrets/keda-gpu-scaler/gateway/token"


def _token(values: dict[str, Any]) -> list[dict[str, Any]]:
    return render({"gateway": {"metricsToken": values}})


def test_no_token_objects_unless_asked(defaults: list[dict[str, Any]]) -> None:
    assert not [d for d in defaults if d["metadata"]["name"].startswith(TOKEN_SA)]
    assert f"{ENV_PREFIX}GATEWAY_TOKEN_FILE" not in env(defaults)


def test_the_pickers_identity_may_get_metrics_and_nothing_else() -> None:
    docs = _token({"enabled": True})
    for doc in docs:
        validate(doc)
    account = find(docs, "ServiceAccount", TOKEN_SA)
    assert account["automountServiceAccountToken"] is False  # no pod runs as it
    assert _grants(find(docs, "ClusterRole", TOKEN_SA)) == {("(url)", "/metrics", "get")}
    binding = find(docs, "ClusterRoleBinding", TOKEN_SA)
    assert binding["roleRef"]["name"] == TOKEN_SA
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": TOKEN_SA, "namespace": NAMESPACE}]
    secret = find(docs, "Secret", f"{TOKEN_SA}-token")
    assert secret["type"] == "kubernetes.io/service-account-token"
    assert secret["metadata"]["annotations"]["kubernetes.io/service-account.name"] == TOKEN_SA


def test_the_token_is_mounted_read_only_and_named_to_the_scaler_https_only_by_default() -> None:
    docs = _token({"enabled": True})
    given = env(docs)
    assert given[f"{ENV_PREFIX}GATEWAY_TOKEN_FILE"] == TOKEN_PATH
    assert f"{ENV_PREFIX}GATEWAY_TOKEN_PLAIN_HTTP" not in given
    (mount,) = [m for m in scaler(docs)["volumeMounts"] if m["name"] == "gateway-token"]
    assert mount["readOnly"] is True and TOKEN_PATH.startswith(mount["mountPath"] + "/")
    volumes = find(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    (volume,) = [v for v in volumes if v["name"] == "gateway-token"]
    (source,) = volume["projected"]["sources"]
    assert source["secret"] == {"name": f"{TOKEN_SA}-token", "items": [{"key": "token", "path": "token"}]}
    settings = build_settings(env_values(given))
    assert str(settings.gateway_token_file) == TOKEN_PATH and not settings.gateway_token_plain_http


def test_plain_http_is_an_explicit_value_and_needs_the_token() -> None:
    given = env(_token({"enabled": True, "plainHTTP": True}))
    assert given[f"{ENV_PREFIX}GATEWAY_TOKEN_PLAIN_HTTP"] == "on"
    assert build_settings(env_values(given)).gateway_token_plain_http
    with pytest.raises(helm.HelmError, match=r"gateway\.metricsToken\.plainHTTP needs"):
        render_files({"gateway": {"metricsToken": {"plainHTTP": True}}})


def test_an_existing_secret_replaces_the_one_the_chart_makes() -> None:
    docs = _token({"enabled": True, "existingSecret": "minted-epp-token"})
    assert not [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"].startswith(TOKEN_SA)]
    volumes = find(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    (volume,) = [v for v in volumes if v["name"] == "gateway-token"]
    assert volume["projected"]["sources"][0]["secret"]["name"] == "minted-epp-token"


@pytest.fixture(scope="module")
def defaults() -> list[dict[str, Any]]:
    return render()


# --- the optional tenant NetworkPolicy ------------------------------------------------------------------

# What a tenant namespace serving through llm-d holds: the model server (8000), and the endpoint picker
# whose ext-proc port (9002, gRPC from the gateway) and metrics port (9090) must stay reachable.
GATEWAY_PORTS = [
    {"port": 8000, "protocol": "TCP"},
    {"port": 9002, "protocol": "TCP"},
    {"port": 9090, "protocol": "TCP"},
]


def test_every_example_leaves_the_tenant_policy_off() -> None:
    for example in sorted((CHART / "examples").glob("*-values.yaml")):
        values = yaml.safe_load(example.read_text())
        assert not values.get("tenantNetworkPolicy", {}).get("enabled", False), example.name


def test_the_tenant_policy_keeps_the_gateways_ports_open() -> None:
    entry = {
        "namespace": "llm",
        "ports": [{"port": 8000}, {"port": 9090}],
        "additionalIngress": [{"ports": GATEWAY_PORTS}],
    }
    docs = render({"tenantNetworkPolicy": {"enabled": True, "namespaces": [entry]}})
    policy = find(docs, "NetworkPolicy", f"{RELEASE}-scrape")
    validate(policy)
    scrape, kept = policy["spec"]["ingress"]
    assert {p["port"] for p in scrape["ports"]} == {8000, 9090} and scrape["from"]  # the scaler only
    # An empty podSelector isolates every pod of the namespace for Ingress: the gateway's ports stay
    # open to any source in the same policy.
    assert policy["spec"]["podSelector"] == {}
    assert "from" not in kept and kept["ports"] == GATEWAY_PORTS
    values = (CHART / "values.yaml").read_text()
    assert "9002" in values and "isolates" in values


def test_chart_and_kustomize_component_give_the_same_identity_and_mount() -> None:
    from test_chart import MANIFESTS, kustomize

    chart = _token({"enabled": True, "plainHTTP": True})
    component = kustomize(MANIFESTS / "examples" / "vllm-wake-from-zero" / "scaler")
    for kind, name in (
        ("ServiceAccount", TOKEN_SA),
        ("Secret", f"{TOKEN_SA}-token"),
        ("ClusterRole", TOKEN_SA),
        ("ClusterRoleBinding", TOKEN_SA),
    ):
        ours, theirs = find(chart, kind, name), find(component, kind, name)
        for key in ("rules", "subjects", "roleRef", "type", "automountServiceAccountToken"):
            assert ours.get(key) == theirs.get(key), (kind, key)
        annotation = "kubernetes.io/service-account.name"
        assert ours["metadata"].get("annotations", {}).get(annotation) == theirs["metadata"].get(
            "annotations", {}
        ).get(annotation)
    (theirs_container,) = find(component, "Deployment")["spec"]["template"]["spec"]["containers"]
    token_env = {e["name"]: e["value"] for e in theirs_container["env"] if "GATEWAY_TOKEN" in e["name"]}
    assert token_env == {k: v for k, v in env(chart).items() if "GATEWAY_TOKEN" in k}
    volumes = [
        [
            v
            for v in find(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
            if v["name"] == "gateway-token"
        ]
        for docs in (chart, component)
    ]
    assert volumes[0] == volumes[1]
