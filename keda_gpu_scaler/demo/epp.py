"""A simulated endpoint-picker (EPP) page for the demo, tests and benchmarks: queue state → page text (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from keda_gpu_scaler.pages import pagetext
from keda_gpu_scaler.pages.gateways import epp


class Queued(NamedTuple):
    """The labels of one queue series: which model the requests ask for, their fairness id and priority."""

    target_model: str
    fairness_id: str = "default"
    priority: str = "0"
    model: str = ""  # model_name as the client asked for it (empty: the same as target_model)


def epp_page(
    pool: str,
    queue: Mapping[Queued, float],
    *,
    flow_control: bool = True,
    names: tuple[str, ...] = (epp.QUEUE,),
    ready_endpoints: int = 0,
) -> str:
    """An llm-d-router EPP's page for one pool (client_golang's layout and number spelling): its ready
    endpoints and, with flow control, its saturation and one queue series per entry of `queue` under
    each of `names` (the current name by default; an older EPP's is epp.QUEUE_OLD)."""
    families: list[pagetext.Family] = [
        (
            epp.READY_ENDPOINTS,
            "gauge",
            "Number of ready endpoints in the pool.",
            [(pagetext.label_text([("name", pool)]), str(ready_endpoints))],
        )
    ]
    if flow_control:
        saturation = 1.0 if ready_endpoints == 0 else 0.2
        families.append(
            (
                epp.SATURATION,
                "gauge",
                "Saturation of the pool as seen by flow control (1 gates dispatch).",
                [
                    (
                        pagetext.label_text([("inference_pool", pool), ("stage", "dispatch")]),
                        pagetext.go_float(saturation),
                    )
                ],
            )
        )
        series = [
            (
                pagetext.label_text(
                    [
                        ("fairness_id", entry.fairness_id),
                        ("inference_pool", pool),
                        ("model_name", entry.model or entry.target_model),
                        ("priority", entry.priority),
                        ("target_model_name", entry.target_model),
                    ]
                ),
                pagetext.go_float(count),
            )
            for entry, count in queue.items()
        ]
        for name in names:
            families.append(
                (name, "gauge", "Current number of requests held in the flow-control queue.", series)
            )
    return pagetext.render(families)
