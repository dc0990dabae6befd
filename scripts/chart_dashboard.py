"""Writes charts/keda-gpu-scaler/dashboards/keda-gpu-scaler.json, the Grafana dashboard of the scaler.

Panels are listed below as (title, unit, queries); `python scripts/chart_dashboard.py` rewrites the JSON
and the chart tests check it is up to date, that every query parses and names only the scaler's series.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DASHBOARD = (
    Path(__file__).resolve().parents[1] / "charts" / "keda-gpu-scaler" / "dashboards" / "keda-gpu-scaler.json"
)

# Every scaler series of the dashboard is selected with this (the template variables below).
SEL = 'job=~"$job"'
SO = f'{SEL}, namespace=~"$namespace", scaledobject=~"$scaledobject"'
RATE = "$__rate_interval"

# (row title, [(panel title, unit, description, [(legend, expr)])])
ROWS: list[tuple[str, list[tuple[str, str, str, list[tuple[str, str]]]]]] = [
    (
        "ScaledObjects",
        [
            (
                "Trigger value per ScaledObject",
                "short",
                "Last value returned to KEDA (sum or mean of the target pods' GPU %). With AverageValue the "
                "HPA wants ceil(value / threshold) replicas: compare with the ScaledObject's threshold.",
                [
                    (
                        "{{namespace}}/{{scaledobject}} {{metric}}",
                        f"max by (namespace, scaledobject, metric) (keda_gpu_scaler_trigger_value{{{SO}}})",
                    )
                ],
            ),
            (
                "Active triggers",
                "short",
                "1 when the last evaluation found the workload active (value above activationThreshold).",
                [
                    (
                        "{{namespace}}/{{scaledobject}}",
                        f"max by (namespace, scaledobject) (keda_gpu_scaler_trigger_active{{{SO}}})",
                    )
                ],
            ),
            (
                "Evaluations by result",
                "ops",
                "no_data: too few target pods had fresh data; KEDA got UNAVAILABLE.",
                [
                    (
                        "{{result}}",
                        f"sum by (result) (rate(keda_gpu_scaler_evaluations_total{{{SEL}}}[{RATE}]))",
                    )
                ],
            ),
            (
                "UNAVAILABLE answers",
                "ops",
                "GetMetrics and IsActive calls answered UNAVAILABLE (data missing): KEDA holds the workload.",
                [
                    (
                        "{{method}}",
                        f'sum by (method) (rate(keda_gpu_scaler_rpc_requests_total{{{SEL}, code="UNAVAILABLE"}}[{RATE}]))',
                    )
                ],
            ),
        ],
    ),
    (
        "gRPC",
        [
            (
                "Calls by method and code",
                "ops",
                "Every call KEDA made, by gRPC status code.",
                [
                    (
                        "{{method}} {{code}}",
                        f"sum by (method, code) (rate(keda_gpu_scaler_rpc_requests_total{{{SEL}}}[{RATE}]))",
                    )
                ],
            ),
            (
                "Call latency (p50, p99)",
                "s",
                "Latency of the calls KEDA makes; StreamIsActive counts its set-up only.",
                [
                    (
                        f"p{q} {{{{method}}}}",
                        f"histogram_quantile(0.{q}, sum by (method, le) (rate(keda_gpu_scaler_rpc_duration_seconds_bucket{{{SEL}}}[{RATE}])))",
                    )
                    for q in ("5", "99")
                ],
            ),
            (
                "Open StreamIsActive streams",
                "short",
                "Streams open per replica; past --max-streams new ones are refused.",
                [("{{instance}}", f"keda_gpu_scaler_open_streams{{{SEL}}}")],
            ),
            (
                "Activations pushed",
                "ops",
                "true values pushed on StreamIsActive (a workload went from idle to busy).",
                [("pushes", f"sum(rate(keda_gpu_scaler_stream_pushes_total{{{SEL}}}[{RATE}]))")],
            ),
        ],
    ),
    (
        "Data sources",
        [
            (
                "Exporter scrapes by result",
                "ops",
                "Scrapes of the GPU exporters (dcgm-exporter, AMD device-metrics-exporter, ACK).",
                [("{{result}}", f"sum by (result) (rate(keda_gpu_scaler_scrapes_total{{{SEL}}}[{RATE}]))")],
            ),
            (
                "Exporter scrape failure ratio",
                "percentunit",
                "Share of failed exporter scrapes, per replica.",
                [
                    (
                        "{{instance}}",
                        f'sum by (instance) (rate(keda_gpu_scaler_scrapes_total{{{SEL}, result="error"}}[{RATE}]))'
                        f" / sum by (instance) (rate(keda_gpu_scaler_scrapes_total{{{SEL}}}[{RATE}]))",
                    )
                ],
            ),
            (
                "Exporter scrape latency (p50, p99)",
                "s",
                "Scrape latency including parsing.",
                [
                    (
                        f"p{q}",
                        f"histogram_quantile(0.{q}, sum by (le) (rate(keda_gpu_scaler_scrape_duration_seconds_bucket{{{SEL}}}[{RATE}])))",
                    )
                    for q in ("5", "99")
                ],
            ),
            (
                "Prometheus source queries",
                "ops",
                "Queries the Prometheus source sends, by purpose and result.",
                [
                    (
                        "{{query}} {{result}}",
                        f"sum by (query, result) (rate(keda_gpu_scaler_prometheus_queries_total{{{SEL}}}[{RATE}]))",
                    )
                ],
            ),
            (
                "Prometheus source query latency (p99)",
                "s",
                "Latency of the Prometheus source's queries including parsing.",
                [
                    (
                        "p99",
                        f"histogram_quantile(0.99, sum by (le) (rate(keda_gpu_scaler_prometheus_query_duration_seconds_bucket{{{SEL}}}[{RATE}])))",
                    )
                ],
            ),
        ],
    ),
    (
        "Kubernetes discovery",
        [
            (
                "Followed ScaledObjects",
                "short",
                "ScaledObjects the scaler keeps state for (past --max-scaledobjects new ones are refused), and"
                " those whose targets Kubernetes discovery follows, per replica.",
                [
                    ("all {{instance}}", f"keda_gpu_scaler_scaledobjects_followed{{{SEL}}}"),
                    ("discovery {{instance}}", f"keda_gpu_scaler_kubernetes_tracked_scaledobjects{{{SEL}}}"),
                ],
            ),
            (
                "Discovered exporters",
                "short",
                "Exporter endpoints scraped because target pods run on their nodes.",
                [("{{instance}}", f"keda_gpu_scaler_kubernetes_discovered_exporters{{{SEL}}}")],
            ),
            (
                "Pod watch restarts",
                "ops",
                "gone: relisted after 410 (normal); error: API server unreachable or access denied.",
                [
                    (
                        "{{reason}}",
                        f"sum by (reason) (rate(keda_gpu_scaler_kubernetes_watch_restarts_total{{{SEL}}}[{RATE}]))",
                    )
                ],
            ),
            (
                "Aggregation mismatches",
                "ops",
                "Evaluations whose explicit aggregation contradicts the trigger's metricType.",
                [("mismatches", f"sum(rate(keda_gpu_scaler_aggregation_mismatches_total{{{SEL}}}[{RATE}]))")],
            ),
        ],
    ),
]

_DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": _DATASOURCE,
        "query": {"query": query, "refId": name},
        "definition": query,
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


def dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    panel_id = 0
    y = 0
    for row_title, row_panels in ROWS:
        panel_id += 1
        panels.append(
            {
                "id": panel_id,
                "type": "row",
                "title": row_title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        y += 1
        for index, (title, unit, description, queries) in enumerate(row_panels):
            panel_id += 1
            panels.append(
                {
                    "id": panel_id,
                    "type": "timeseries",
                    "title": title,
                    "description": description,
                    "datasource": _DATASOURCE,
                    "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": y + 8 * (index // 2)},
                    "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                    "options": {
                        "legend": {"displayMode": "list", "placement": "bottom"},
                        "tooltip": {"mode": "multi"},
                    },
                    "targets": [
                        {
                            "refId": chr(ord("A") + n),
                            "datasource": _DATASOURCE,
                            "expr": expr,
                            "legendFormat": legend,
                        }
                        for n, (legend, expr) in enumerate(queries)
                    ],
                }
            )
        y += 8 * ((len(row_panels) + 1) // 2)
    return {
        "title": "KEDA GPU scaler",
        "uid": "keda-gpu-scaler",
        "description": "keda-gpu-scaler: trigger values, calls from KEDA, exporter scrapes, Kubernetes discovery",
        "tags": ["keda", "gpu", "autoscaling"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "timezone": "",
        "annotations": {"list": []},
        "links": [],
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                },
                _variable("job", "Job", "label_values(keda_gpu_scaler_open_streams, job)"),
                _variable(
                    "namespace",
                    "Namespace",
                    'label_values(keda_gpu_scaler_trigger_value{job=~"$job"}, namespace)',
                ),
                _variable(
                    "scaledobject",
                    "ScaledObject",
                    'label_values(keda_gpu_scaler_trigger_value{job=~"$job", namespace=~"$namespace"}, scaledobject)',
                ),
            ]
        },
        "panels": panels,
    }


def text() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    DASHBOARD.write_text(text())
