"""Simulated inference-server pages for the demo fleet: a state of requests and KV-cache → page text (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from keda_gpu_scaler.pages import pagetext
from keda_gpu_scaler.pages.engines.formats import SGLANG, VLLM, VLLM_WAITING_BY_REASON


class EngineLoad(NamedTuple):
    """One engine's state: requests running and waiting, and the KV-cache in use as a fraction 0–1."""

    running: float
    waiting: float
    kv_cache: float


def load_for(in_flight: float, *, max_running: int = 64, kv_per_request: float = 0.012) -> EngineLoad:
    """What one engine shows with `in_flight` requests: up to `max_running` run, the rest wait.

    vLLM's --max-num-seqs (SGLang's --max-running-requests) caps the batch; each running request holds
    KV blocks, so the cache fills with the batch (`kv_per_request` of it each, clipped at full).
    """
    total = max(0, round(in_flight))
    running = min(total, max_running)
    kv = min(1.0, running * kv_per_request)
    return EngineLoad(float(running), float(total - running), round(kv, 4))


def split(in_flight: float, engines: int) -> list[float]:
    """`in_flight` requests spread over data-parallel engines as a round-robin balancer leaves them."""
    total = max(0, round(in_flight))
    return [float(total // engines + (1 if index < total % engines else 0)) for index in range(engines)]


class EngineTotals(NamedTuple):
    """One engine's counters since its start: requests finished, prompt tokens, generated tokens."""

    finished: float
    prompt_tokens: float
    generation_tokens: float


def vllm_page(
    model: str,
    engines: Sequence[EngineLoad | tuple[float, float, float]],
    totals: Sequence[EngineTotals] = (),
) -> str:
    """A vLLM (V1) server's gauges for one pod: one engine per entry (data-parallel rank = index), and
    with `totals` (one per engine) its request and token counters, as `metric: demand` reads them.

    With no engines the page holds no vLLM family at all, as a server whose engine is still starting.
    """
    loads = [EngineLoad(*load) for load in engines]
    labels = [f'engine="{index}",model_name="{pagetext.escape(model)}"' for index in range(len(loads))]
    families: list[tuple[str, str, str, list[tuple[str, float]]]] = []
    if loads:
        families = [
            (VLLM.running.name, "gauge", "Number of requests in model execution batches.", []),
            (VLLM.waiting.name, "gauge", "Number of requests waiting to be processed.", []),
            (VLLM_WAITING_BY_REASON, "gauge", "Number of requests waiting to be processed, by reason.", []),
            (VLLM.kv_cache.name, "gauge", "KV-cache usage. 1 means 100 percent usage.", []),
        ]
        for label, load in zip(labels, loads, strict=True):
            families[0][3].append((label, load.running))
            families[1][3].append((label, load.waiting))
            # All waiting for room in the batch: the breakdown must never be added to the total.
            families[2][3].append((label + ',reason="capacity"', load.waiting))
            families[2][3].append((label + ',reason="deferred"', 0.0))
            families[3][3].append((label, load.kv_cache))
    if loads and totals:
        finished: list[tuple[str, float]] = []
        for label, total in zip(labels, totals, strict=True):
            # vLLM creates a series per finish reason at start-up; the demo's requests all end on a stop.
            finished += [(f'{label},finished_reason="{reason}"', 0.0) for reason in ("abort", "length")]
            finished.append((label + ',finished_reason="stop"', total.finished))
        families += [
            ("vllm:request_success_total", "counter", "Count of successfully processed requests.", finished),
            (
                "vllm:prompt_tokens_total",
                "counter",
                "Number of prefill tokens processed.",
                [(label, t.prompt_tokens) for label, t in zip(labels, totals, strict=True)],
            ),
            (
                "vllm:generation_tokens_total",
                "counter",
                "Number of generation tokens processed.",
                [(label, t.generation_tokens) for label, t in zip(labels, totals, strict=True)],
            ),
        ]
    return _page(_python_process_families() + families)


def sglang_page(
    model: str,
    dp_ranks: Sequence[EngineLoad | tuple[float, float, float]],
    *,
    tp_size: int = 1,
    totals: Sequence[EngineTotals] = (),
) -> str:
    """An SGLang server's scheduler gauges: one scheduler per dp_rank, each repeated on its tp ranks; with
    `totals` (one per dp_rank) its tokenizer's request and token counters, once a request has finished
    (one tokenizer per server: summed over the ranks; a labelled counter is printed once it moved).

    Printed as SGLang's multiprocess client library does: HELP "Multiprocess metric", labels sorted.
    """
    max_tokens = 65536
    rows: dict[str, list[tuple[str, float]]] = {
        SGLANG.running.name: [],
        "sglang:num_used_tokens": [],
        SGLANG.kv_cache.name: [],
        SGLANG.waiting.name: [],
        "sglang:max_total_num_tokens": [],
    }
    for dp_rank, load in enumerate(EngineLoad(*load) for load in dp_ranks):
        for tp_rank in range(tp_size):
            label = (
                f'dp_rank="{dp_rank}",engine_type="unified",model_name="{pagetext.escape(model)}",'
                f'moe_ep_rank="0",pp_rank="0",tp_rank="{tp_rank}"'
            )
            rows[SGLANG.running.name].append((label, load.running))
            rows["sglang:num_used_tokens"].append((label, float(round(load.kv_cache * max_tokens))))
            rows[SGLANG.kv_cache.name].append((label, load.kv_cache))
            rows[SGLANG.waiting.name].append((label, load.waiting))
            rows["sglang:max_total_num_tokens"].append((label, float(max_tokens)))
    families = [(name, "gauge", "Multiprocess metric", values) for name, values in rows.items() if values]
    finished = sum(total.finished for total in totals)
    if finished > 0:
        label = f'model_name="{pagetext.escape(model)}"'
        counted = {
            "sglang:num_requests_total": finished,
            "sglang:prompt_tokens_total": sum(total.prompt_tokens for total in totals),
            "sglang:generation_tokens_total": sum(total.generation_tokens for total in totals),
        }
        families += [
            (name, "counter", "Multiprocess metric", [(label, value)]) for name, value in counted.items()
        ]
    return _page(families)


def _python_process_families() -> list[tuple[str, str, str, list[tuple[str, float]]]]:
    """The client library's default families every vLLM page starts with (static values)."""
    return [
        (
            "python_info",
            "gauge",
            "Python platform information",
            [('implementation="CPython",major="3",minor="12",patchlevel="11",version="3.12.11"', 1.0)],
        ),
        ("process_open_fds", "gauge", "Number of open file descriptors.", [("", 73.0)]),
    ]


def _page(families: Sequence[tuple[str, str, str, Sequence[tuple[str, float]]]]) -> str:
    """A page as the Python client library prints it (vLLM, SGLang and TGI's Rust exporter alike)."""
    return pagetext.render(
        (name, kind, help_text, [(labels, pagetext.python_float(value)) for labels, value in samples])
        for name, kind, help_text, samples in families
    )
