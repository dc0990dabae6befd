"""This scaler as it ships, deciding for the simulator: the simulated pods' and endpoint picker's pages,
rendered in the text format, are read by the product's own page readers into its store (with each page's
collection time), the simulator answers as Kubernetes through the TargetResolver seam, and every value
is asked through the servicer's GetMetrics and IsActive, as KEDA asks it. Nothing of the decision is
rebuilt here.

The LLM simulator hands its pages over when a value is asked, oldest first, each at the time it was
collected (llm_signals.LlmCluster): what the store and its page listeners keep depends only on the pages
and their times, so this is the state a scaler that read each page as it came would hold then, and only
pages that are read are rendered.
"""

from __future__ import annotations

from collections.abc import Coroutine, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar, cast

import grpc

from bench.simulator.llm_fleet import TPOT_BOUNDS, TTFT_BOUNDS
from keda_gpu_scaler.app import App
from keda_gpu_scaler.collect.gateway_source import GatewayCollectorSink
from keda_gpu_scaler.collect.inference import InferencePages
from keda_gpu_scaler.collect.scrape import GPU_EXPORTER_PAGES, PageReader, read_page
from keda_gpu_scaler.collect.store import Page as StoredPage
from keda_gpu_scaler.collect.store import Store
from keda_gpu_scaler.collect.wanted import PodPage
from keda_gpu_scaler.config.settings import Settings
from keda_gpu_scaler.core.snapshot import PodEndpoint, SourceKind, Targets
from keda_gpu_scaler.core.trigger import TriggerSpec
from keda_gpu_scaler.core.trigger_parse import parse_trigger
from keda_gpu_scaler.demo.engines import EngineLoad, EngineTotals, vllm_page
from keda_gpu_scaler.demo.epp import Queued, epp_page
from keda_gpu_scaler.externalscaler import (
    externalscaler_pb2 as pb,  # KEDA's wire messages (externalscaler.proto)
)
from keda_gpu_scaler.pages import pagetext

NAMESPACE = "llm"
SCALED_OBJECT = "vllm"
POOL = "pool"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
EPP_URL = "http://epp.llm.svc:9090/metrics"
_ENGINE_LABELS = f'engine="0",model_name="{MODEL}"'
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Page:
    """One pod's inference page at one instant: vllm:num_requests_running/waiting, kv_cache_usage_perc,
        the counters request_success_total, prompt_tokens_total and generation_tokens_total, and the sums of
        the per-request histograms (prompt and generated tokens, time to first token, time per output token) and
    the latency histograms' bucket counts."""

    running: int
    waiting: int
    kv: float  # 0–1
    finished: int = 0
    prompt_tokens: int = 0
    generation_tokens: float = 0.0
    prompt_sum: int = 0  # of finished requests
    output_sum: int = 0
    ttft_sum: float = 0.0
    ttft_count: int = 0
    tpot_sum: float = 0.0
    ttft_buckets: tuple[int, ...] = ()  # per bucket of llm_fleet.TTFT_BOUNDS, +Inf last; (): none printed
    tpot_buckets: tuple[int, ...] = ()  # … of TPOT_BOUNDS


def pod_url(pod: str) -> str:
    return f"http://{pod}.llm.pod:8000/metrics"


def pod_endpoint(pod: str, ready: bool) -> PodEndpoint:
    """A simulated pod as discovery describes it: its page is pod_url(pod), on the port named `metrics`."""
    return PodEndpoint(pod, f"{pod}.llm.pod", ready, {"metrics": 8000}, None, (("metrics", 8000),))


def exporter_url(pod: str) -> str:
    """The GPU exporter of the node the pod runs on (one GPU, one pod per node)."""
    return f"http://node-{pod}:9400/metrics"


def _histogram(
    name: str,
    help_text: str,
    total: float,
    count: int,
    bounds: tuple[float, ...] = (),
    counts: Sequence[int] = (),
) -> str:
    """A histogram family: cumulative `le` buckets from per-bucket `counts` (+Inf last), or the +Inf one only."""
    labels = _ENGINE_LABELS
    buckets, cumulative = [], 0
    for bound, in_bucket in zip(bounds, counts, strict=False):
        cumulative += in_bucket
        buckets.append(f'{name}_bucket{{{labels},le="{bound!r}"}} {float(cumulative)!r}\n')
    return (
        f"# HELP {name} {help_text}\n# TYPE {name} histogram\n{''.join(buckets)}"
        f'{name}_bucket{{{labels},le="+Inf"}} {float(count)!r}\n'
        f"{name}_sum{{{labels}}} {float(total)!r}\n{name}_count{{{labels}}} {float(count)!r}\n"
    )


def vllm_text(page: Page) -> bytes:
    """One pod's vLLM /metrics page: gauges, counters, the per-request token histograms (their +Inf bucket)
    and the latency histograms with vLLM's buckets, which the product's latency guard reads."""
    gauges_and_counters = vllm_page(
        MODEL,
        [EngineLoad(page.running, page.waiting, page.kv)],
        [EngineTotals(page.finished, page.prompt_tokens, page.generation_tokens)],
    )
    histograms = (
        _histogram(
            "vllm:request_prompt_tokens", "Prompt tokens per request.", page.prompt_sum, page.finished
        ),
        _histogram(
            "vllm:request_generation_tokens", "Generated tokens per request.", page.output_sum, page.finished
        ),
        _histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token.",
            page.ttft_sum,
            page.ttft_count,
            TTFT_BOUNDS,
            page.ttft_buckets,
        ),
        # One observation per finished request, its mean time per output token: vLLM's per-request
        # histogram (0.10 on), not time_per_output_token/inter_token_latency, which observe every token.
        _histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            page.tpot_sum,
            page.finished,
            TPOT_BOUNDS,
            page.tpot_buckets,
        ),
    )
    return (gauges_and_counters + "".join(histograms)).encode()


def dcgm_text(pod: str, utilization: float, gpus: int = 1) -> bytes:
    """dcgm-exporter's GPU_UTIL lines for the pod's GPUs on its node (integer percentages, as it prints)."""
    series = []
    for index in range(gpus):
        gpu = [("gpu", f"{index}"), ("UUID", f"GPU-{pod}-{index}"), ("Hostname", f"node-{pod}")]
        labels = [*gpu, ("container", "main"), ("namespace", NAMESPACE), ("pod", pod)]
        series.append((pagetext.label_text(labels), str(round(utilization))))
    return pagetext.render([("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", series)]).encode()


def epp_text(pending: int, ready: int) -> bytes:
    return epp_page(POOL, {Queued(MODEL): float(pending)}, ready_endpoints=ready).encode()


class SimulatedKubernetes:
    """The TargetResolver the evaluator asks: the target's Ready and starting pods as the fleet has them."""

    def __init__(self) -> None:
        self.targets = Targets(frozenset(), "AverageValue")

    def check(self, spec: TriggerSpec) -> None:
        """Every trigger names its pods by podNamePrefix here: nothing to refuse."""

    def resolve(self, namespace: str, name: str, spec: TriggerSpec, exporters: bool = True) -> Targets:
        return self.targets

    def forget(self, namespace: str, name: str) -> None:
        """Nothing is kept per ScaledObject."""


class SimulatedCollector:
    """Takes the place of the scrape collectors: the sources the product adds, each read on delivery with
    its own PageReader into the store, as a successful scrape records it."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.readers: dict[str, PageReader] = {}
        self.reuse_unchanged_pages = True  # GatewayCollectorSink turns it off; every page is read here

    def add(
        self,
        url: str,
        *,
        reader: PageReader | None = None,
        kind: SourceKind = SourceKind.SCRAPE,
        namespace: str | None = None,
        pod: str | None = None,
        interest_key: Hashable | None = None,
    ) -> None:
        self.readers[url] = reader or GPU_EXPORTER_PAGES
        self.store.add_source(url, kind, namespace, pod)

    def remove(self, url: str) -> None:
        self.readers.pop(url, None)
        self.store.remove_source(url)

    def deliver(self, url: str, body: bytes, collected_at: float) -> None:
        """The page fetched from url at collected_at; a source the product does not read is not fetched."""
        reader = self.readers.get(url)
        if reader is not None:
            by_namespace = read_page(body, reader)
            self.store.record_page(StoredPage(url, collected_at, by_namespace, not by_namespace))


class Refused(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, details)  # both args: a worker's error unpickles in the judge's parent
        self.code = code

    def __str__(self) -> str:
        return f"{self.code.name}: {self.args[1]}"


class _Context:
    """What the servicer's unary methods use of a gRPC context: abort."""

    async def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise Refused(code, details)


def _answer(call: Coroutine[Any, Any, T]) -> T:
    """The servicer's unary methods never wait (they answer from caches): one step runs one to its end."""
    try:
        call.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    call.close()
    raise RuntimeError("the servicer waited on something: the simulator has no event loop to give it")


def ref_key(ref: pb.ScaledObjectRef) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(ref.scalerMetadata.items()))


class SimulatedScaler:
    """The product's App on the simulation's clock, fed what a cluster would show it (module docstring).

    Per call: follow(metadata) as KEDA's reconcile does, the pages collected since (scrape_pods,
    scrape_exporters, read_gateway), cluster(now, ready, starting), then metric() or active()."""

    def __init__(self) -> None:
        self.now = 0.0
        self.kubernetes = SimulatedKubernetes()
        settings = Settings(kubernetes="off", gateway_urls=((NAMESPACE, POOL, EPP_URL),))
        self.app = App(settings, clock=lambda: self.now, targets=self.kubernetes)
        self.collector = SimulatedCollector(self.app.store)
        self.pod_pages = InferencePages(cast(Any, self.collector))
        self.app.gateway_pages.start(GatewayCollectorSink(cast(Any, self.collector)))
        self._pods: set[str] = set()  # pods whose page sources exist
        self._metric_names: dict[tuple[tuple[str, str], ...], str] = {}

    def follow(self, metadata: dict[str, str]) -> pb.ScaledObjectRef:
        """The trigger's reference; the first time, GetMetricSpec as KEDA calls it when it reconciles,
        which makes the scaler follow the trigger (and want its pages) before any page is handed over."""
        ref = pb.ScaledObjectRef(name=SCALED_OBJECT, namespace=NAMESPACE, scalerMetadata=metadata)
        key = ref_key(ref)
        if key not in self._metric_names:
            spec = _answer(self.app.service.GetMetricSpec(ref, cast(Any, _Context())))
            self._metric_names[key] = spec.metricSpecs[0].metricName
        return ref

    def scrape_pods(self, at: float, pages: dict[str, Page]) -> None:
        """Each Ready pod's vLLM page, collected at `at`."""
        self.now = at
        for pod, page in pages.items():
            self._add_sources(pod)
            self.collector.deliver(pod_url(pod), vllm_text(page), at)

    def scrape_exporters(self, at: float, utilization: dict[str, float], gpus: int = 1) -> None:
        """The GPU exporter page of each pod's node, collected at `at`."""
        self.now = at
        for pod, value in utilization.items():
            self._add_sources(pod)
            self.collector.deliver(exporter_url(pod), dcgm_text(pod, value, gpus), at)

    def read_gateway(self, at: float, pending: int, ready: int) -> None:
        self.now = at
        self.collector.deliver(EPP_URL, epp_text(pending, ready), at)

    def cluster(self, now: float, ready: Iterable[str], starting: Iterable[str] = ()) -> None:
        """The clock and what the API server says now: pods gone lose their page sources at once."""
        self.now = now
        ready, starting = frozenset(ready), frozenset(starting)
        # Each pod as discovery hands it over: its address and the port its page is read at (pod_url).
        endpoints = {pod: pod_endpoint(pod, pod in ready) for pod in ready | starting}
        # With no pod its /scale says 0: the simulated fleet makes a starting pod for every replica asked.
        at_zero = 0 if not ready and not starting else None
        targets = Targets(ready, "AverageValue", starting, endpoints, replicas=at_zero)
        for gone in self._pods - targets.pods - targets.starting:
            self._pods.discard(gone)
            self.collector.remove(pod_url(gone))
            self.collector.remove(exporter_url(gone))
        self.kubernetes.targets = targets

    def metric(self, ref: pb.ScaledObjectRef) -> float | None:
        """GetMetrics's value now; None: UNAVAILABLE (KEDA's error: the HPA keeps the replica count)."""
        request = pb.GetMetricsRequest(scaledObjectRef=ref, metricName=self._metric_names[ref_key(ref)])
        try:
            answer = _answer(self.app.service.GetMetrics(request, cast(Any, _Context())))
        except Refused as refused:
            if refused.code is grpc.StatusCode.UNAVAILABLE:
                return None
            raise
        return float(answer.metricValues[0].metricValueFloat)

    def target(self, ref: pb.ScaledObjectRef) -> float:
        """GetMetricSpec's target now: what an `external-push` trigger's HPA holds, since KEDA receives
        every change the product publishes on StreamMetricSpec, and GetMetricSpec answers the last one.
        The trigger counts one spec stream open, as KEDA v2.21 keeps one for each `external-push` trigger."""
        followed = self.app.registry.get(NAMESPACE, SCALED_OBJECT)
        if followed is not None:
            followed.spec_streams[parse_trigger(ref.scalerMetadata)] = 1
        spec = _answer(self.app.service.GetMetricSpec(ref, cast(Any, _Context())))
        return float(spec.metricSpecs[0].targetSizeFloat)

    def active(self, ref: pb.ScaledObjectRef) -> bool | None:
        """IsActive now; None: UNAVAILABLE."""
        try:
            return bool(_answer(self.app.service.IsActive(ref, cast(Any, _Context()))).result)
        except Refused as refused:
            if refused.code is grpc.StatusCode.UNAVAILABLE:
                return None
            raise

    def _add_sources(self, pod: str) -> None:
        if pod not in self._pods:
            self._pods.add(pod)
            self.pod_pages.add_page(PodPage(pod_url(pod), NAMESPACE, pod))
            self.collector.add(exporter_url(pod))
