"""JSON schemas for the custom resources the manifests use: the fields of KEDA's and cert-manager's CRDs we rely on.

Strict on purpose (no unknown fields): a misspelt field in an example would be silently dropped by an API
server that prunes unknown fields, and the example would not do what its comments say.
"""

from __future__ import annotations

from typing import Any


def _object(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
    }


_STRING = {"type": "string"}
_INT = {"type": "integer"}
_BOOL = {"type": "boolean"}
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = _object(
    {"name": _STRING, "namespace": _STRING, "labels": _STRING_MAP, "annotations": _STRING_MAP},
    ("name",),
)
_HPA_BEHAVIOR = {"type": "object"}  # autoscaling/v2 HorizontalPodAutoscalerBehavior, passed through

# keda.sh/v1alpha1 ScaledObject (KEDA 2.17+ CRD, the fields examples may use).
SCALED_OBJECT = _object(
    {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "kind": {"const": "ScaledObject"},
        "metadata": _METADATA,
        "spec": _object(
            {
                "scaleTargetRef": _object(
                    {
                        "apiVersion": _STRING,
                        "kind": _STRING,
                        "name": _STRING,
                        "envSourceContainerName": _STRING,
                    },
                    ("name",),
                ),
                "pollingInterval": _INT,
                "cooldownPeriod": _INT,
                "initialCooldownPeriod": _INT,
                "idleReplicaCount": _INT,
                "minReplicaCount": _INT,
                "maxReplicaCount": _INT,
                "fallback": _object(
                    {
                        "failureThreshold": _INT,
                        "replicas": _INT,
                        "behavior": {
                            "enum": [
                                "static",
                                "currentReplicas",
                                "currentReplicasIfHigher",
                                "currentReplicasIfLower",
                            ]
                        },
                    },
                    ("failureThreshold", "replicas"),
                ),
                "advanced": _object(
                    {
                        "restoreToOriginalReplicaCount": _BOOL,
                        "horizontalPodAutoscalerConfig": _object(
                            {"name": _STRING, "behavior": _HPA_BEHAVIOR}
                        ),
                    }
                ),
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": _object(
                        {
                            "type": _STRING,
                            "name": _STRING,
                            "useCachedMetrics": _BOOL,
                            # KEDA's CRD: metadata is a map of strings; an unquoted number is rejected.
                            "metadata": _STRING_MAP,
                            "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                            "authenticationRef": _object(
                                {
                                    "name": _STRING,
                                    "kind": {
                                        "enum": ["TriggerAuthentication", "ClusterTriggerAuthentication"]
                                    },
                                },
                                ("name",),
                            ),
                        },
                        ("type", "metadata"),
                    ),
                },
            },
            ("scaleTargetRef", "triggers"),
        ),
    },
    ("apiVersion", "kind", "metadata", "spec"),
)

_SECRET_TARGET_REF = {
    "type": "array",
    "items": _object({"parameter": _STRING, "name": _STRING, "key": _STRING}, ("parameter", "name", "key")),
}


def _trigger_authentication(kind: str) -> dict[str, Any]:
    return _object(
        {
            "apiVersion": {"const": "keda.sh/v1alpha1"},
            "kind": {"const": kind},
            "metadata": _METADATA,
            "spec": _object({"secretTargetRef": _SECRET_TARGET_REF}),
        },
        ("apiVersion", "kind", "metadata", "spec"),
    )


_ISSUER_REF = _object({"name": _STRING, "kind": _STRING, "group": _STRING}, ("name",))

# cert-manager.io/v1 Issuer and Certificate (the fields the tls overlay uses).
ISSUER = _object(
    {
        "apiVersion": {"const": "cert-manager.io/v1"},
        "kind": {"const": "Issuer"},
        "metadata": _METADATA,
        "spec": {
            "oneOf": [
                _object({"selfSigned": _object({})}, ("selfSigned",)),
                _object({"ca": _object({"secretName": _STRING}, ("secretName",))}, ("ca",)),
            ]
        },
    },
    ("apiVersion", "kind", "metadata", "spec"),
)
_USAGES = {
    "type": "array",
    "items": {"enum": ["server auth", "client auth", "digital signature", "key encipherment", "cert sign"]},
}
CERTIFICATE = _object(
    {
        "apiVersion": {"const": "cert-manager.io/v1"},
        "kind": {"const": "Certificate"},
        "metadata": _METADATA,
        "spec": _object(
            {
                "secretName": _STRING,
                "commonName": _STRING,
                "dnsNames": {"type": "array", "items": _STRING},
                "isCA": _BOOL,
                "duration": {"type": "string", "pattern": r"^[0-9]+(h|m|s)$"},
                "renewBefore": {"type": "string", "pattern": r"^[0-9]+(h|m|s)$"},
                "usages": _USAGES,
                "privateKey": _object(
                    {
                        "algorithm": {"enum": ["RSA", "ECDSA", "Ed25519"]},
                        "size": _INT,
                        "rotationPolicy": {"enum": ["Never", "Always"]},
                    }
                ),
                "issuerRef": _ISSUER_REF,
            },
            ("secretName", "issuerRef"),
        ),
    },
    ("apiVersion", "kind", "metadata", "spec"),
)

# inference.networking.k8s.io/v1 InferencePool (Gateway API Inference Extension 1.x, the fields the
# examples use).
INFERENCE_POOL = _object(
    {
        "apiVersion": {"const": "inference.networking.k8s.io/v1"},
        "kind": {"const": "InferencePool"},
        "metadata": _METADATA,
        "spec": _object(
            {
                "selector": _object({"matchLabels": _STRING_MAP}, ("matchLabels",)),
                "targetPorts": {
                    "type": "array",
                    "minItems": 1,
                    "items": _object(
                        {"number": {"type": "integer", "minimum": 1, "maximum": 65535}}, ("number",)
                    ),
                },
                "endpointPickerRef": _object(
                    {
                        "group": _STRING,
                        "kind": _STRING,
                        "name": _STRING,
                        "port": _object(
                            {"number": {"type": "integer", "minimum": 1, "maximum": 65535}}, ("number",)
                        ),
                        "failureMode": {"enum": ["FailOpen", "FailClose"]},
                    },
                    ("name",),
                ),
            },
            ("selector", "targetPorts", "endpointPickerRef"),
        ),
    },
    ("apiVersion", "kind", "metadata", "spec"),
)

SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("keda.sh/v1alpha1", "ScaledObject"): SCALED_OBJECT,
    ("keda.sh/v1alpha1", "TriggerAuthentication"): _trigger_authentication("TriggerAuthentication"),
    ("keda.sh/v1alpha1", "ClusterTriggerAuthentication"): _trigger_authentication(
        "ClusterTriggerAuthentication"
    ),
    ("cert-manager.io/v1", "Issuer"): ISSUER,
    ("cert-manager.io/v1", "Certificate"): CERTIFICATE,
    ("inference.networking.k8s.io/v1", "InferencePool"): INFERENCE_POOL,
}
