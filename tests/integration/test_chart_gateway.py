"""The chart's endpoint-picker side: the limited identity whose token pickers get (gateway.metricsToken),
and the optional tenant NetworkPolicy keeping the gateway's own ports open."""

from __future__ import annotations

from pathlib import Path
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

from keda_gpu_scaler.config.settings import build_settings, env_values  # noqa: E402

TOKEN_SA = f"{RELEASE}-epp-metrics"
TOKEN_DIR = "/var/run/secrets/keda-gpu-scaler/gateway"  # one file per namespace


def _token(values: dict[str, Any]) -> list[dict[str, Any]]:
    return render({"gateway": {"metricsToken": values}})


MINT_ROLE = f"{TOKEN_SA}-token"


def test_no_token_objects_unless_asked(defaults: list[dict[str, Any]]) -> None:
    assert not [d for d in defaults if d["metadata"]["name"].startswith(TOKEN_SA)]
    assert not [k for k in env(defaults) if k.startswith(f"{ENV_PREFIX}GATEWAY_TOKEN")]


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
    # Its tokens are minted, short-lived: no long-lived token Secret exists.
    assert not [d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"].startswith(TOKEN_SA)]


def test_by_default_the_scaler_may_mint_that_one_identity_s_tokens_and_is_told_to() -> None:
    docs = _token({"enabled": True})
    role = find(docs, "Role", MINT_ROLE)
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["serviceaccounts/token"],
            "resourceNames": [TOKEN_SA],
            "verbs": ["create"],
        }
    ]
    binding = find(docs, "RoleBinding", MINT_ROLE)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": MINT_ROLE}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": RELEASE, "namespace": NAMESPACE}]
    given = env(docs)
    assert given[f"{ENV_PREFIX}GATEWAY_TOKEN_SERVICEACCOUNT"] == f"{NAMESPACE}/{TOKEN_SA}"
    assert (
        f"{ENV_PREFIX}GATEWAY_TOKEN_FILE" not in given
        and f"{ENV_PREFIX}GATEWAY_TOKEN_PLAIN_HTTP" not in given
    )
    assert not [m for m in scaler(docs)["volumeMounts"] if m["name"] == "gateway-token"]
    settings = build_settings(env_values(given))
    assert settings.gateway_token_serviceaccount == (NAMESPACE, TOKEN_SA)
    assert settings.gateway_token_file is None and not settings.gateway_token_plain_http
    # Without rbac.create the operator grants it: the chart makes no Role.
    assert not [
        d
        for d in render({"gateway": {"metricsToken": {"enabled": True}}, "rbac": {"create": False}})
        if d["kind"] == "Role" and d["metadata"]["name"] == MINT_ROLE
    ]


def test_plain_http_is_an_explicit_value_and_needs_the_token() -> None:
    given = env(_token({"enabled": True, "plainHTTP": True}))
    assert given[f"{ENV_PREFIX}GATEWAY_TOKEN_PLAIN_HTTP"] == "on"
    assert build_settings(env_values(given)).gateway_token_plain_http
    with pytest.raises(helm.HelmError, match=r"gateway\.metricsToken\.plainHTTP needs"):
        render_files({"gateway": {"metricsToken": {"plainHTTP": True}}})


def test_mode_secret_mounts_the_operators_secret_read_only_and_makes_no_role() -> None:
    docs = _token({"enabled": True, "mode": "secret", "existingSecret": "minted-epp-token"})
    assert not [
        d for d in docs if d["kind"] in ("Secret", "Role") and d["metadata"]["name"].startswith(TOKEN_SA)
    ]
    given = env(docs)
    assert given[f"{ENV_PREFIX}GATEWAY_TOKEN_FILE"] == TOKEN_DIR
    assert f"{ENV_PREFIX}GATEWAY_TOKEN_SERVICEACCOUNT" not in given
    (mount,) = [m for m in scaler(docs)["volumeMounts"] if m["name"] == "gateway-token"]
    assert mount["readOnly"] is True and mount["mountPath"] == TOKEN_DIR
    volumes = find(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    (volume,) = [v for v in volumes if v["name"] == "gateway-token"]
    (source,) = volume["projected"]["sources"]
    # Every key is mounted: each a namespace's token (never one token for all: docs/SECURITY.md).
    assert source["secret"] == {"name": "minted-epp-token"}
    assert str(build_settings(env_values(given)).gateway_token_file) == TOKEN_DIR


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"mode": "secret"}, r"mode=secret needs gateway\.metricsToken\.existingSecret"),
        ({"existingSecret": "mine"}, r"existingSecret is read with mode=secret only"),
        ({"mode": "file"}, r"mode"),
    ],
)
def test_a_mode_and_secret_that_do_not_fit_stop_the_render(values: dict[str, Any], words: str) -> None:
    with pytest.raises(helm.HelmError, match=words):
        render_files({"gateway": {"metricsToken": {"enabled": True, **values}}})


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


def test_chart_and_kustomize_component_give_the_same_identity_and_mount(tmp_path: Path) -> None:
    from test_chart import MANIFESTS, kustomize_with

    chart = _token({"enabled": True, "plainHTTP": True})
    component = kustomize_with(
        tmp_path, [MANIFESTS / "base"], [MANIFESTS / "components" / "gateway-metrics-token"]
    )
    for kind, name in (
        ("ServiceAccount", TOKEN_SA),
        ("ClusterRole", TOKEN_SA),
        ("ClusterRoleBinding", TOKEN_SA),
        ("Role", MINT_ROLE),
        ("RoleBinding", MINT_ROLE),
    ):
        ours, theirs = find(chart, kind, name), find(component, kind, name)
        for key in ("rules", "subjects", "roleRef", "automountServiceAccountToken"):
            assert ours.get(key) == theirs.get(key), (kind, key)
        assert ours["metadata"].get("namespace") == theirs["metadata"].get("namespace"), kind
    assert not [d for d in component if d["kind"] == "Secret"]  # no long-lived token anywhere
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
    assert volumes == [[], []]
