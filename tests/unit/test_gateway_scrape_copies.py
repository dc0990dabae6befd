"""Through Prometheus, an endpoint-picker replica scraped by two jobs (a ServiceMonitor and a PodMonitor)
is read once, but the copy kept may be either job's from one answer to the next: its turned-away counters
are one series whichever copy (SPEC §7). Keyed with the job's labels, a change of copy read as every
series gone (an EPP restart), and the growth that should wake the pool was thrown away."""

from __future__ import annotations

from keda_gpu_scaler.pages.exposition import Sample
from keda_gpu_scaler.pages.gateways import PoolQueue, QueueTable, read_queue, since, table_from_samples
from keda_gpu_scaler.pages.prometheus_answer import gateway_replicas

COUNTER = "llm_d_epp_flow_control_requests_total"
SATURATION = "llm_d_epp_flow_control_pool_saturation"
TARGET = {"namespace": "llm", "pod": "chat-pool-epp-0", "container": "epp", "instance": "10.0.0.7:9090"}
JOB_A = {**TARGET, "job": "operator"}
JOB_B = {**TARGET, "job": "direct", "service": "chat-pool-epp", "endpoint": "metrics"}
REJECTED = {"inference_pool": "chat-pool", "outcome": "RejectedNoEndpoints", "priority": "0"}


def table(a: tuple[float, float], b: tuple[float, float], at: float) -> QueueTable:
    """The replica's table from an answer with both jobs' copies: (counter value, sample time) per job."""
    samples = []
    for target, (value, when) in ((JOB_A, a), (JOB_B, b)):
        samples.append(Sample(COUNTER, {**REJECTED, **target}, value, int(when * 1000)))
        samples.append(Sample(SATURATION, {"inference_pool": "chat-pool", **target}, 1.0, int(when * 1000)))
    [(name, series)] = gateway_replicas(samples, "llm", at, 60.0).by_pod
    assert name == "chat-pool-epp-0"
    return table_from_samples(series)


def test_a_counter_grown_between_answers_wakes_whichever_job_s_copy_is_kept() -> None:
    first = since(None, table((5, 55), (5, 42), 58))  # job A's copy kept (equal, newer)
    second = since(first, table((5, 55), (8, 57), 59))  # job B's kept (larger): the counter grew 5 → 8
    reading = read_queue(second, "chat-pool", "llm", None)
    assert isinstance(reading, PoolQueue) and reading.turned_away == 3, reading
