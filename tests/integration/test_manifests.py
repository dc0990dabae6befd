"""manifests/: every file and kustomization renders and validates offline against Kubernetes and CRD schemas."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from crd_schemas import SCHEMAS
from support import kustomize_command

from keda_gpu_scaler import __version__
from keda_gpu_scaler.config.flags import FLAGS
from keda_gpu_scaler.core.trigger_parse import parse_trigger
from keda_gpu_scaler.kubernetes.scaledobject import EXTERNAL_TRIGGER_TYPES

MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
# The oldest Kubernetes the managed offerings of the examples still run, and the newest schemas shipped.
KUBERNETES_VERSIONS = ("1.30.0", kubernetes_validate.utils.latest_version())
KUSTOMIZATIONS = sorted(p.parent for p in MANIFESTS.rglob("kustomization.yaml"))
COMPONENTS = [
    k for k in KUSTOMIZATIONS if yaml.safe_load((k / "kustomization.yaml").read_text())["kind"] == "Component"
]
BUILDS = [k for k in KUSTOMIZATIONS if k not in COMPONENTS]
ENV_PREFIX = "KEDA_GPU_SCALER_"


def _id(path: Path) -> str:
    return str(path.relative_to(MANIFESTS))


def _patch_files() -> set[Path]:
    patches: set[Path] = set()
    for directory in KUSTOMIZATIONS:
        for patch in yaml.safe_load((directory / "kustomization.yaml").read_text()).get("patches") or ():
            patches.add((directory / patch["path"]).resolve())
    return patches


# Values for another project's Helm chart (llm-d's router) are not Kubernetes objects: test_wake_example.py
# checks them.
PLAIN_FILES = sorted(
    p
    for p in MANIFESTS.rglob("*.yaml")
    if p.name != "kustomization.yaml"
    and p.resolve() not in _patch_files()
    and not p.name.endswith("-values.yaml")
)
# The LLM examples, and the one HPA behavior they all take (manifests/components/llm-hpa-behavior).
LLM_EXAMPLES = ("vllm-llm-serving", "vllm-wake-from-zero")
HPA_BEHAVIOR = MANIFESTS / "components" / "llm-hpa-behavior" / "behavior.yaml"


def validate(doc: dict[str, Any]) -> None:
    """Kubernetes' own schemas (strict: no unknown fields) for built-in kinds, CRD subsets for the rest."""
    schema = SCHEMAS.get((doc["apiVersion"], doc["kind"]))
    if schema is not None:
        jsonschema.validate(doc, schema)
        return
    for version in KUBERNETES_VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def kustomize(directory: Path) -> list[dict[str, Any]]:
    command = kustomize_command(directory)
    if command is None:
        pytest.skip("neither kustomize nor kubectl (with its built-in kustomize) is installed")
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return documents(done.stdout)


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {_id(d): kustomize(d) for d in BUILDS}


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(matches) == 1, f"{kind} {name}: {len(matches)} found"
    return matches[0]


def containers(docs: list[dict[str, Any]], deployment: str) -> dict[str, dict[str, Any]]:
    spec = find(docs, "Deployment", deployment)["spec"]["template"]["spec"]
    return {c["name"]: c for c in spec["containers"]}


@pytest.mark.parametrize("path", PLAIN_FILES, ids=_id)
def test_every_file_validates(path: Path) -> None:
    docs = documents(path.read_text())
    assert docs
    for doc in docs:
        validate(doc)


@pytest.mark.parametrize("directory", BUILDS, ids=_id)
def test_every_kustomization_renders_and_validates(
    directory: Path, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    docs = rendered[_id(directory)]
    assert docs
    for doc in docs:
        validate(doc)


def test_sidecar_component_renders_into_keda_operator(tmp_path: Path) -> None:
    # A stand-in for KEDA's own install manifest, which the component is added to.
    (tmp_path / "keda.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "keda-operator", "namespace": "keda"},
                "spec": {
                    "selector": {"matchLabels": {"app": "keda-operator"}},
                    "template": {
                        "metadata": {"labels": {"app": "keda-operator"}},
                        "spec": {
                            "serviceAccountName": "keda-operator",
                            "containers": [
                                {
                                    "name": "keda-operator",
                                    "image": "ghcr.io/kedacore/keda:2.17.0",
                                    "ports": [
                                        {"name": "metrics", "containerPort": 8080},
                                        {"name": "probes", "containerPort": 8081},
                                    ],
                                }
                            ],
                        },
                    },
                },
            }
        )
    )
    component = os.path.relpath(MANIFESTS / "overlays" / "sidecar", tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump({"resources": ["keda.yaml"], "components": [component]})
    )
    docs = kustomize(tmp_path)
    for doc in docs:
        validate(doc)
    pod = containers(docs, "keda-operator")
    assert set(pod) == {"keda-operator", "keda-gpu-scaler"}
    scaler = pod["keda-gpu-scaler"]
    env = {e["name"]: e["value"] for e in scaler["env"]}
    taken = {p["containerPort"] for p in pod["keda-operator"]["ports"]}
    assert {p["containerPort"] for p in scaler["ports"]}.isdisjoint(taken)
    assert int(env[f"{ENV_PREFIX}HTTP_ADDRESS"].rpartition(":")[2]) not in taken
    assert env[f"{ENV_PREFIX}GRPC_ADDRESS"].endswith(":6000")  # scalerAddress: localhost:6000
    assert scaler["livenessProbe"]["grpc"] == {"port": 6000, "service": "liveness"}
    binding = find(docs, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "keda-operator", "namespace": "keda"}]
    assert binding["roleRef"]["name"] == find(docs, "ClusterRole")["metadata"]["name"]


def test_base_is_hardened_with_grpc_probes(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["base"]
    assert {
        d["metadata"].get("namespace") for d in docs if d["kind"] not in ("ClusterRole", "ClusterRoleBinding")
    } == {"keda"}
    deployment = find(docs, "Deployment", "keda-gpu-scaler")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == find(docs, "ServiceAccount")["metadata"]["name"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (scaler,) = pod["containers"]
    assert scaler["image"] == f"ghcr.io/keda-gpu-scaler/keda-gpu-scaler:{__version__}"
    assert scaler["livenessProbe"]["grpc"] == {"port": 6000, "service": "liveness"}
    assert scaler["readinessProbe"]["grpc"] == {"port": 6000, "service": "readiness"}
    security = scaler["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert set(scaler["resources"]) == {"requests", "limits"}
    service = find(docs, "Service", "keda-gpu-scaler")
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {"grpc": 6000, "http": 8080}
    headless = find(docs, "Service", "keda-gpu-scaler-headless")
    assert headless["spec"]["clusterIP"] == "None"
    for doc in (service, headless):
        assert doc["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_cluster_role_is_read_only_and_every_rule_says_why(rendered: dict[str, list[dict[str, Any]]]) -> None:
    role = find(rendered["base"], "ClusterRole")
    grants = {
        (group, resource, verb)
        for rule in role["rules"]
        if "nonResourceURLs" not in rule
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    # Exactly what discovery calls (kube.KubeApi): get, list+watch ScaledObjects, get /scale, list+watch pods, and
    # list+watch the InferencePools and endpoint picker Services that pending triggers name.
    assert grants == {
        ("keda.sh", "scaledobjects", "get"),
        ("keda.sh", "scaledobjects", "list"),
        ("keda.sh", "scaledobjects", "watch"),
        ("*", "*/scale", "get"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("inference.networking.k8s.io", "inferencepools", "list"),
        ("inference.networking.k8s.io", "inferencepools", "watch"),
        ("", "services", "list"),
        ("", "services", "watch"),
    }
    # What the endpoint picker's authorizer checks before it serves its page, and nothing more.
    urls = [rule for rule in role["rules"] if "nonResourceURLs" in rule]
    assert urls == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    binding = find(rendered["base"], "ClusterRoleBinding")
    assert binding["subjects"][0]["name"] == find(rendered["base"], "ServiceAccount")["metadata"]["name"]
    lines = (MANIFESTS / "base" / "clusterrole" / "clusterrole.yaml").read_text().splitlines()
    for number, line in enumerate(lines):
        if line.strip().startswith(("- apiGroups:", "- nonResourceURLs:")):
            assert lines[number - 1].strip().startswith("#"), f"rule at line {number + 1} has no comment"


def test_tls_overlay(rendered: dict[str, list[dict[str, Any]]]) -> None:
    docs = rendered["overlays/tls"]
    server = find(docs, "Certificate", "keda-gpu-scaler-server")
    hosts = {_scaler_host(doc) for doc in _example_scaled_objects()}
    assert hosts <= set(server["spec"]["dnsNames"])
    assert "keda-gpu-scaler-headless.keda" in server["spec"]["dnsNames"]
    scaler = containers(docs, "keda-gpu-scaler")["scaler"]
    env = {e["name"]: e["value"] for e in scaler["env"]}
    mounts = {m["name"]: m["mountPath"] for m in scaler["volumeMounts"]}
    volumes = {v["name"]: v for v in find(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == server["spec"]["secretName"]
    for name in ("TLS_CERT_FILE", "TLS_KEY_FILE", "TLS_CLIENT_CA_FILE"):
        assert env[ENV_PREFIX + name].startswith(mounts["tls"] + "/")
    # The kubelet's grpc probes cannot speak TLS.
    assert "grpc" not in scaler["livenessProbe"] and "grpc" not in scaler["readinessProbe"]
    auth = find(docs, "ClusterTriggerAuthentication")
    refs = {r["parameter"]: r for r in auth["spec"]["secretTargetRef"]}
    assert set(refs) == {"caCert", "tlsClientCert", "tlsClientKey"}
    client = find(docs, "Certificate", "keda-gpu-scaler-client")
    assert {r["name"] for r in refs.values()} == {client["spec"]["secretName"]}
    assert "client auth" in client["spec"]["usages"] and "server auth" in server["spec"]["usages"]
    assert server["spec"]["issuerRef"] == client["spec"]["issuerRef"]


def _example_scaled_objects() -> Iterator[dict[str, Any]]:
    for path in sorted((MANIFESTS / "examples").rglob("*.yaml")):
        for doc in documents(path.read_text()):
            if doc.get("kind") == "ScaledObject":
                yield doc


def _scaler_host(scaled_object: dict[str, Any]) -> str:
    # A ScaledObject may have several of our triggers (vLLM: requests and kv_cache): one scaler for all.
    (host,) = {
        t["metadata"]["scalerAddress"].rpartition(":")[0]
        for t in scaled_object["spec"]["triggers"]
        if t["type"] in EXTERNAL_TRIGGER_TYPES
    }
    return str(host)


def test_examples_cover_every_setup_with_external_and_external_push() -> None:
    for setup in ("aks-nvidia-gpu-operator", "doks-amd-mi300x", "ack-shared-gpu"):
        kinds = set()
        for path in (MANIFESTS / "examples" / setup).glob("scaledobject*.yaml"):
            for doc in documents(path.read_text()):
                kinds.update(
                    t["type"] for t in doc["spec"]["triggers"] if t["type"] in EXTERNAL_TRIGGER_TYPES
                )
        assert kinds == EXTERNAL_TRIGGER_TYPES, setup


def test_example_triggers_are_valid_for_the_scaler() -> None:
    for doc in _example_scaled_objects():
        for trigger in doc["spec"]["triggers"]:
            if trigger["type"] not in EXTERNAL_TRIGGER_TYPES:
                continue
            spec = parse_trigger(trigger["metadata"])  # raises on any key or value the scaler rejects
            assert spec.pod_name_prefix is None  # the scaler runs with Kubernetes discovery in a cluster
            assert _scaler_host(doc) in ("keda-gpu-scaler.keda", "keda-gpu-scaler-headless.keda", "localhost")


def test_doks_example_tolerates_the_amd_gpu_taint() -> None:
    docs = documents((MANIFESTS / "examples" / "doks-amd-mi300x" / "deployment.yaml").read_text())
    pod = find(docs, "Deployment")["spec"]["template"]["spec"]
    assert {"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["nodeSelector"]["doks.digitalocean.com/gpu-brand"] == "amd"
    assert "amd.com/gpu" in pod["containers"][0]["resources"]["limits"]


def test_every_environment_variable_is_a_flag() -> None:
    known = {flag.env for flag in FLAGS}
    used = set(
        re.findall(rf"\b{ENV_PREFIX}[A-Z_]+\b", "\n".join(p.read_text() for p in MANIFESTS.rglob("*.yaml")))
    )
    assert used and used <= known, used - known


@pytest.mark.parametrize("example", LLM_EXAMPLES)
def test_every_llm_example_scales_with_the_one_hpa_behavior(
    example: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    wanted = yaml.safe_load(HPA_BEHAVIOR.read_text())["spec"]["advanced"]["horizontalPodAutoscalerConfig"]
    scaled = [d for d in rendered[f"examples/{example}"] if d["kind"] == "ScaledObject"]
    assert scaled
    for doc in scaled:
        assert doc["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == wanted["behavior"]
        assert doc["spec"]["triggers"]  # the patch adds, it does not replace
    up, down = wanted["behavior"]["scaleUp"], wanted["behavior"]["scaleDown"]
    assert (up["stabilizationWindowSeconds"], up["selectPolicy"]) == (0, "Max")
    assert {(p["type"], p["value"], p["periodSeconds"]) for p in up["policies"]} == {
        ("Percent", 100, 15),
        ("Pods", 4, 15),
    }
    assert down == {
        "stabilizationWindowSeconds": 120,
        "policies": [{"type": "Percent", "value": 50, "periodSeconds": 60}],
    }


def test_every_example_with_llm_triggers_is_an_llm_example() -> None:
    llm_metrics = {"requests", "queue", "kv_cache", "pending"}
    found = set()
    for path in (MANIFESTS / "examples").rglob("scaledobject*.yaml"):
        for doc in documents(path.read_text()):
            if any(t["metadata"].get("metric") in llm_metrics for t in doc["spec"]["triggers"]):
                found.add(path.parent.name)
    assert found == set(LLM_EXAMPLES)
