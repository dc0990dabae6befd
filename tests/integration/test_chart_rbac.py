"""Who the scaler's own ServiceAccount is granted what, in the chart and the kustomize manifests: nothing it
has no use for (no `get /metrics` once endpoint pickers get a token of their own, no RBAC and no mounted
token when it makes no Kubernetes API call)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

helm = pytest.importorskip("helm_python", reason="helm-python-sdk (the dev extras) is not installed")

from test_chart import (  # noqa: E402
    ENV_PREFIX,
    MANIFESTS,
    NAMESPACE,
    RELEASE,
    env,
    find,
    kustomize,
    kustomize_with,
    render,
    render_files,
    validate,
)

from keda_gpu_scaler.config.settings import build_settings, env_values  # noqa: E402

SCALER = {"name": RELEASE, "namespace": NAMESPACE}
METRICS_GRANT = ("(url)", "/metrics", "get")


def bound_grants(docs: list[dict[str, Any]], subject: dict[str, str]) -> set[tuple[str, str, str]]:
    """Every (API group or "(url)", resource or URL, verb) that (Cluster)RoleBindings in docs give subject."""
    roles = {
        (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d
        for d in docs
        if d["kind"] in ("Role", "ClusterRole")
    }
    found: set[tuple[str, str, str]] = set()
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        namespace = binding["metadata"].get("namespace")
        if not any(
            s["kind"] == "ServiceAccount"
            and s["name"] == subject["name"]
            and s.get("namespace", namespace) == subject["namespace"]
            for s in binding["subjects"]
        ):
            continue
        ref = binding["roleRef"]
        role = roles[(ref["kind"], namespace if ref["kind"] == "Role" else None, ref["name"])]
        for rule in role["rules"]:
            for verb in rule["verbs"]:
                found |= {("(url)", url, verb) for url in rule.get("nonResourceURLs", [])}
                found |= {(g, r, verb) for g in rule.get("apiGroups", []) for r in rule.get("resources", [])}
    return found


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = find(docs, "Deployment")["spec"]["template"]["spec"]
    return spec


# --- the endpoint pickers' own token: the scaler's identity keeps no `get /metrics` -------------------------


@pytest.mark.parametrize("rbac", [{}, {"namespaces": ["llm"]}], ids=["cluster", "namespaced"])
def test_with_the_pickers_token_the_scaler_has_no_metrics_grant(rbac: dict[str, Any]) -> None:
    without = render({"rbac": rbac})
    assert METRICS_GRANT in bound_grants(without, SCALER)  # its own token goes to pickers: they check it
    docs = render({"rbac": rbac, "gateway": {"metricsToken": {"enabled": True}}})
    own = bound_grants(docs, SCALER)
    assert METRICS_GRANT not in own, sorted(own)
    # Everything else discovery reads is still granted, and the pickers' identity has the grant.
    assert own >= bound_grants(without, SCALER) - {METRICS_GRANT}
    assert bound_grants(docs, {"name": f"{RELEASE}-epp-metrics", "namespace": NAMESPACE}) == {METRICS_GRANT}
    assert env(docs)[f"{ENV_PREFIX}GATEWAY_TOKEN_SERVICEACCOUNT"] == f"{NAMESPACE}/{RELEASE}-epp-metrics"


def test_the_kustomize_token_component_drops_the_scalers_metrics_grant(tmp_path: Path) -> None:
    base = kustomize(MANIFESTS / "base")
    assert METRICS_GRANT in bound_grants(base, SCALER)
    for docs in (
        kustomize_with(tmp_path, [MANIFESTS / "base"], [MANIFESTS / "components" / "gateway-metrics-token"]),
    ):
        own = bound_grants(docs, SCALER)
        # What the base grants, less /metrics, plus minting the pickers' identity's tokens.
        mint = ("", "serviceaccounts/token", "create")
        assert own == bound_grants(base, SCALER) - {METRICS_GRANT} | {mint}, sorted(own)
        assert bound_grants(docs, {"name": "keda-gpu-scaler-epp-metrics", "namespace": "keda"}) == {
            METRICS_GRANT
        }
        for doc in docs:
            validate(doc)
    # The chart and the component leave the scaler the same rights.
    chart = render({"gateway": {"metricsToken": {"enabled": True}}})
    assert bound_grants(chart, SCALER) == bound_grants(docs, SCALER)


# --- flags.kubernetes off: no API call, so no RBAC and no mounted token ---------------------------------------


def test_kubernetes_off_renders_no_rbac_and_mounts_no_token() -> None:
    docs = render({"flags": {"kubernetes": "off", "exporterUrl": ["http://10.0.0.1:9400/metrics"]}})
    for doc in docs:
        validate(doc)
    assert bound_grants(docs, SCALER) == set()
    assert not [d for d in docs if d["kind"] in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")]
    assert pod_spec(docs)["automountServiceAccountToken"] is False
    assert find(docs, "ServiceAccount", RELEASE)["automountServiceAccountToken"] is False
    settings = build_settings(env_values(env(docs)))
    assert settings.kubernetes == "off"
    # On (the chart's default) and auto, discovery reads the API with the mounted token.
    for mode in ("on", "auto"):
        docs = render({"flags": {"kubernetes": mode}})
        assert pod_spec(docs)["automountServiceAccountToken"] is True
        assert ("", "pods", "list") in bound_grants(docs, SCALER)


def test_kubernetes_off_keeps_only_what_the_pickers_of_gateway_url_check() -> None:
    # Pickers given by --gateway-url get the scaler's own token (over verified HTTPS): it is mounted and
    # may get /metrics, nothing more.
    flags = {"kubernetes": "off", "gatewayUrl": ["llm/pool=https://10.0.0.9:9090/metrics"]}
    docs = render({"flags": flags})
    assert bound_grants(docs, SCALER) == {METRICS_GRANT}
    assert pod_spec(docs)["automountServiceAccountToken"] is True
    assert not bound_grants(render({"flags": flags, "rbac": {"gateway": False}}), SCALER)
    # With a token file of the pickers' own, the scaler's token goes nowhere.
    token = {"enabled": True, "mode": "secret", "existingSecret": "minted-epp-token"}
    docs = render({"flags": flags, "gateway": {"metricsToken": token}})
    assert bound_grants(docs, SCALER) == set()
    assert pod_spec(docs)["automountServiceAccountToken"] is False
    # Minting needs the API server: refused at render, as the scaler would refuse it at start.
    with pytest.raises(helm.HelmError, match=r"gateway\.metricsToken\.mode=request needs Kubernetes"):
        render_files({"flags": flags, "gateway": {"metricsToken": {"enabled": True}}})


# --- when the gateway rules may be dropped ----------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "charts/keda-gpu-scaler/values.yaml",
        "charts/keda-gpu-scaler/README.md",
        "docs/operating.md",
        "docs/SECURITY.md",
        "manifests/base/clusterrole/clusterrole.yaml",
    ],
)
def test_the_gateway_rules_are_dropped_only_without_pending_or_an_inference_pool(path: str) -> None:
    # A demand or requests trigger naming inferencePool reads the pool and its endpoint pickers too: without
    # rbac.gateway it is UNAVAILABLE naming the RBAC denial, so "no trigger uses pending" is not enough.
    text = " ".join(
        line.strip().lstrip("#").replace("`", "")
        for line in (MANIFESTS.parent / path).read_text().splitlines()
    )
    said = re.findall(r"no trigger uses pending(.{0,25})", " ".join(text.split()))
    assert said, f"{path} no longer says when rbac.gateway may be off"
    assert all(tail.startswith(" or names inferencePool") for tail in said), said


def test_the_token_components_objects_are_in_keda_whatever_the_build_sets(tmp_path: Path) -> None:
    """Added to the TLS overlay (no namespace transformer: its objects name keda themselves), the component's
    ServiceAccount, Role and RoleBinding had no namespace and landed in kubectl's current one, while the
    scaler mints tokens of keda/keda-gpu-scaler-epp-metrics: every TokenRequest refused."""
    docs = kustomize_with(
        tmp_path, [MANIFESTS / "overlays" / "tls"], [MANIFESTS / "components" / "gateway-metrics-token"]
    )
    (container,) = find(docs, "Deployment", "keda-gpu-scaler")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    namespace, name = env["KEDA_GPU_SCALER_GATEWAY_TOKEN_SERVICEACCOUNT"].split("/")
    assert find(docs, "ServiceAccount", name)["metadata"].get("namespace") == namespace
    for kind in ("Role", "RoleBinding"):
        assert find(docs, kind, "keda-gpu-scaler-epp-metrics-token")["metadata"].get("namespace") == namespace
