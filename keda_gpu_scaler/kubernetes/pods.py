"""Pods as discovery needs them (from the API's JSON) and the rules that make a pod a target, as the HPA does."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from keda_gpu_scaler.core.selectors import ExporterSelector


@dataclass(frozen=True, slots=True)
class PodInfo:
    namespace: str
    name: str
    labels: Mapping[str, str]
    node: str | None
    ip: str | None
    phase: str
    ready: bool
    deleting: bool
    ports: tuple[tuple[str | None, int], ...]  # (name, containerPort) of every container, in order

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def counts_as_target(self) -> bool:
        """A target pod is one the HPA counts as ready: Running, Ready and not being deleted.

        Pending, not-yet-ready and terminating pods are neither targets nor missing pods: the HPA's
        readyPods (metricType Value) leaves them out, and counting them as missing would fill in the
        threshold for a pod that cannot serve yet, or is leaving.
        """
        return self.phase == "Running" and self.ready and not self.deleting

    @property
    def starting(self) -> bool:
        """Exists but is not Ready yet (Pending, pulling an image, loading a model, or failing its probe).

        SPEC §4: such pods are neither targets nor missing pods, but while no pod is Ready they mean the
        workload has replicas, so its value cannot be 0.
        """
        return not self.counts_as_target and not self.deleting and self.phase not in ("Succeeded", "Failed")

    @property
    def occupies_node(self) -> bool:
        """Scheduled and not finished: its node's exporter is worth scraping before it turns ready."""
        return self.node is not None and not self.deleting and self.phase not in ("Succeeded", "Failed")


def pod_info(obj: Mapping[str, Any]) -> PodInfo:
    """Read the fields discovery uses from a Pod object of the API's JSON (missing fields are tolerated)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ()
    )
    ports: list[tuple[str | None, int]] = []
    for container in spec.get("containers") or ():
        for port in container.get("ports") or ():
            number = port.get("containerPort")
            if isinstance(number, int) and (port.get("protocol") or "TCP") == "TCP":
                ports.append((port.get("name"), number))
    return PodInfo(
        namespace=meta.get("namespace") or "",
        name=meta.get("name") or "",
        labels=dict(meta.get("labels") or {}),
        node=spec.get("nodeName") or None,
        ip=status.get("podIP") or None,
        phase=status.get("phase") or "Unknown",
        ready=ready,
        deleting=meta.get("deletionTimestamp") is not None,
        ports=tuple(ports),
    )


def exporter_url(pod: PodInfo, exporter: ExporterSelector) -> str | None:
    """The /metrics URL of an exporter pod, or None while it has no IP or does not declare the named port."""
    if pod.ip is None or pod.deleting or pod.phase != "Running":
        return None
    port: int | None
    if isinstance(exporter.port, int):
        port = exporter.port
    elif isinstance(exporter.port, str):
        port = next((number for name, number in pod.ports if name == exporter.port), None)
    else:
        port = pod.ports[0][1] if pod.ports else None
    if port is None:
        return None
    host = f"[{pod.ip}]" if ":" in pod.ip else pod.ip
    return f"http://{host}:{port}/metrics"
