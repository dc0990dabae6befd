"""The demo fleet on loopback: realistic exporter pages, a load control, loads that move with the clock."""

from __future__ import annotations

import asyncio
import contextlib
import io
import itertools
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from support import eventually

from keda_gpu_scaler.app import App
from keda_gpu_scaler.config.settings import Settings
from keda_gpu_scaler.demo.fleet import DemoFleet
from keda_gpu_scaler.demo.runner import (
    DEMAND_METRIC_NAME,
    INFERENCE_THRESHOLD,
    REQUESTS_METRIC_NAME,
    DemoTarget,
    banner,
    demand_metadata,
    demo_settings,
    demo_targets,
    inference_metadata,
    status_line,
    watch,
)
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb
from keda_gpu_scaler.externalscaler import externalscaler_pb2_grpc as pb_grpc
from keda_gpu_scaler.pages.engines import Engine, InferenceReading, Missing, pod_reading
from keda_gpu_scaler.pages.exposition import parse_exposition

SEED = 7
START = 1_000.0

DCGM_LABEL_ORDER = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION"]
DCGM_POD_LABELS = ["container", "namespace", "pod"]
AMD_MANDATORY_LABELS = {
    "gpu_id",
    "card_model",
    "serial_number",
    "hostname",
    "gpu_partition_id",
    "gpu_compute_partition_type",
    "gpu_memory_partition_type",
    "deployment_mode",
    "pod",
    "namespace",
    "container",
    "job_id",
    "job_user",
    "job_partition",
}
GO_FLOAT = re.compile(r"^-?(?:\d+(?:\.\d+)?(?:e[+-]\d{2,})?|NaN|\+Inf|-Inf)$")
SERIES_LINE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)\{(?P<labels>[^}]*)\} (?P<value>\S+)$")


class FakeClock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def fleet(clock: FakeClock) -> AsyncIterator[DemoFleet]:
    fleet = DemoFleet(clock=clock, seed=SEED)
    await fleet.start()
    try:
        yield fleet
    finally:
        await fleet.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


async def fetch(http: aiohttp.ClientSession, url: str) -> str:
    async with http.get(url) as response:
        assert response.status == 200, await response.text()
        assert response.headers["Content-Type"].startswith("text/plain")
        return await response.text()


async def control(http: aiohttp.ClientSession, fleet: DemoFleet, path: str, **query: str) -> tuple[int, Any]:
    async with http.get(fleet.control_url + path, params=query) as response:
        return response.status, await response.json()


async def control_raw(http: aiohttp.ClientSession, fleet: DemoFleet, query: str) -> tuple[int, Any]:
    """/load with a query string as typed (repeated keys and all)."""
    async with http.get(f"{fleet.control_url}/load?{query}") as response:
        return response.status, await response.json()


def url_of(fleet: DemoFleet, node: str) -> str:
    return fleet.exporter_urls[fleet.nodes.index(node)]


def samples(page: str, family: str) -> list[Sample]:
    found = [s for f in text_string_to_metric_families(page) if f.name == family for s in f.samples]
    assert found, f"no {family} on the page"
    return found


def series_lines(page: str) -> list[re.Match[str]]:
    lines = [line for line in page.splitlines() if line and not line.startswith("#")]
    matches = [SERIES_LINE.match(line) for line in lines]
    assert all(matches), [line for line, m in zip(lines, matches, strict=True) if m is None]
    return [m for m in matches if m is not None]


def label_keys(match: re.Match[str]) -> list[str]:
    return re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="', match["labels"])


def utilisation_by_pod(pages: dict[str, str]) -> dict[str, list[float]]:
    """Per pod, the utilisation each of its GPUs prints (DCGM_FI_DEV_GPU_UTIL or gpu_gfx_activity)."""
    result: dict[str, list[float]] = {}
    for page in pages.values():
        family = "DCGM_FI_DEV_GPU_UTIL" if "DCGM_FI_DEV_GPU_UTIL" in page else "gpu_gfx_activity"
        for sample in samples(page, family):
            pod = sample.labels.get("pod", "")
            if pod:
                result.setdefault(pod, []).append(sample.value)
    return result


async def all_pages(http: aiohttp.ClientSession, fleet: DemoFleet) -> dict[str, str]:
    return {node: await fetch(http, url) for node, url in zip(fleet.nodes, fleet.exporter_urls, strict=True)}


async def test_every_exporter_serves_the_page_of_its_node(
    fleet: DemoFleet, http: aiohttp.ClientSession
) -> None:
    assert fleet.nodes == ("gpu-node-a", "gpu-node-b", "mi300x-node-1")
    assert len(fleet.exporter_urls) == 3
    for node, url in zip(fleet.nodes, fleet.exporter_urls, strict=True):
        assert url.startswith("http://127.0.0.1:") and url.endswith("/metrics")
        page = await fetch(http, url)
        assert page == fleet.render_page(node)
        assert page.endswith("\n")
        assert list(text_string_to_metric_families(page))


async def test_fleet_contents(fleet: DemoFleet) -> None:
    workloads = {w.name: w for w in fleet.workloads}
    assert set(workloads) == {"vllm-qwen", "trainer", "vllm-llama"}
    assert (workloads["vllm-qwen"].vendor, workloads["vllm-qwen"].gpus_per_pod) == ("nvidia", 1)
    assert (workloads["trainer"].vendor, workloads["trainer"].gpus_per_pod) == ("nvidia", 4)
    assert (workloads["vllm-llama"].vendor, workloads["vllm-llama"].gpus_per_pod) == ("amd", 1)
    assert [len(w.pods) for w in (workloads["vllm-qwen"], workloads["trainer"], workloads["vllm-llama"])] == [
        3,
        1,
        2,
    ]
    for workload in fleet.workloads:
        assert all(pod.startswith(workload.name + "-") for pod in workload.pods)


async def test_nvidia_pages_follow_the_dcgm_exporter_format(
    fleet: DemoFleet, http: aiohttp.ClientSession
) -> None:
    gpus_of_pod: dict[str, list[tuple[str, str]]] = {}
    for node in ("gpu-node-a", "gpu-node-b"):
        page = await fetch(http, url_of(fleet, node))
        names = {f.name for f in text_string_to_metric_families(page)}
        for family in (
            "DCGM_FI_DEV_GPU_UTIL",
            "DCGM_FI_DEV_MEM_COPY_UTIL",
            "DCGM_FI_DEV_FB_USED",
            "DCGM_FI_DEV_FB_FREE",
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "DCGM_FI_DEV_GPU_TEMP",
            "DCGM_FI_DEV_POWER_USAGE",
        ):
            assert family in names
            assert f"# HELP {family} " in page
            assert f"# TYPE {family} gauge\n" in page
        assert "# EOF" not in page
        for match in series_lines(page):
            keys = label_keys(match)
            assert keys in (DCGM_LABEL_ORDER, DCGM_LABEL_ORDER + DCGM_POD_LABELS), match[0]
            assert f'Hostname="{node}"' in match["labels"]
            assert 'modelName="NVIDIA H100 80GB HBM3"' in match["labels"]
            if match["name"] in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"):
                assert re.fullmatch(r"\d+", match["value"]), match[0]
            if match["name"].startswith("DCGM_FI_PROF_"):
                assert re.fullmatch(r"\d\.\d{6}", match["value"]), match[0]
        for sample in samples(page, "DCGM_FI_DEV_GPU_UTIL"):
            assert 0 <= sample.value <= 100
            if "pod" in sample.labels:
                assert sample.labels["namespace"] == DemoFleet.NAMESPACE
                gpus_of_pod.setdefault(sample.labels["pod"], []).append((node, sample.labels["UUID"]))
    workloads = {w.name: w for w in fleet.workloads}
    qwen = workloads["vllm-qwen"].pods
    assert all(len(gpus_of_pod[pod]) == 1 for pod in qwen)
    assert {gpus_of_pod[pod][0][0] for pod in qwen} == {"gpu-node-a", "gpu-node-b"}
    assert len({uuid for _, uuid in gpus_of_pod["trainer-0"]}) == 4


async def test_the_idle_gpu_prints_no_pod_labels(fleet: DemoFleet, http: aiohttp.ClientSession) -> None:
    page = await fetch(http, url_of(fleet, "gpu-node-a"))
    idle = [s for s in samples(page, "DCGM_FI_DEV_GPU_UTIL") if "pod" not in s.labels]
    assert len(idle) == 1
    assert idle[0].value == 0
    assert not {"pod", "namespace", "container"} & set(idle[0].labels)
    idle_uuid = idle[0].labels["UUID"]
    for match in series_lines(page):
        if idle_uuid in match["labels"]:
            assert label_keys(match) == DCGM_LABEL_ORDER


async def test_amd_page_follows_the_device_metrics_exporter_format(
    fleet: DemoFleet, http: aiohttp.ClientSession
) -> None:
    page = await fetch(http, url_of(fleet, "mi300x-node-1"))
    names = [f.name for f in text_string_to_metric_families(page)]
    for family in (
        "gpu_gfx_activity",
        "gpu_used_vram",
        "gpu_free_vram",
        "gpu_total_vram",
        "gpu_package_power",
        "gpu_junction_temperature",
    ):
        assert family in names
    assert not [name for name in names if name.startswith("DCGM_")]
    # Empty labels are printed, not left out.
    assert 'pod=""' in page and 'namespace=""' in page and 'container=""' in page
    lines = series_lines(page)
    for match in lines:
        keys = label_keys(match)
        assert keys == sorted(keys), match[0]
        assert set(keys) >= AMD_MANDATORY_LABELS, match[0]
        assert GO_FLOAT.match(match["value"]), match[0]
        assert not match["value"].endswith(".0"), match[0]
    assert any("e+" in m["value"] for m in lines if m["name"] == "gpu_energy_consumed")
    activity = samples(page, "gpu_gfx_activity")
    assert {s.labels["pod"] for s in activity} == {"", "vllm-llama-0", "vllm-llama-1"}
    for sample in activity:
        if sample.labels["pod"]:
            assert sample.labels["namespace"] == DemoFleet.NAMESPACE
        else:
            assert sample.labels["namespace"] == "" and sample.labels["container"] == ""


async def test_pinning_a_pod_through_the_control_endpoint_changes_what_its_exporter_prints(
    fleet: DemoFleet, clock: FakeClock, http: aiohttp.ClientSession
) -> None:
    twin = DemoFleet(clock=clock, seed=SEED)  # never pinned: what the pattern prints
    qwen_pod = next(w for w in fleet.workloads if w.name == "vllm-qwen").pods[2]
    pins = {qwen_pod: 83, "trainer-0": 42, "vllm-llama-1": 17}
    for pod, value in pins.items():
        status, body = await control(http, fleet, "/load", pod=pod, value=str(value))
        assert status == 200, body
        assert body["changed"] == {"pod": pod, "pinned": value}
        listed = {p["name"]: p for w in body["workloads"] for p in w["pods"]}
        assert listed[pod]["pinned"] == value
        assert listed[pod]["load"] == value

    for elapsed in (0.0, 37.0, 95.0):  # pinned means pinned, whatever the pattern does meanwhile
        clock.now = START + elapsed
        printed = utilisation_by_pod(await all_pages(http, fleet))
        assert printed[qwen_pod] == [83]
        assert printed["trainer-0"] == [42, 42, 42, 42]
        assert printed["vllm-llama-1"] == [17]

    status, body = await control(http, fleet, "/load", pod=qwen_pod, value="auto")
    assert status == 200, body
    assert body["changed"] == {"pod": qwen_pod, "pinned": None}
    node_b = await fetch(http, url_of(fleet, "gpu-node-b"))
    assert (
        utilisation_by_pod({"b": node_b})[qwen_pod]
        == utilisation_by_pod({"b": twin.render_page("gpu-node-b")})[qwen_pod]
    )


@pytest.mark.parametrize(
    ("query", "parameter", "mentions"),
    [
        ({"pod": "no-such-pod", "value": "50"}, "'pod'", ["no-such-pod", "vllm-llama-0", "trainer-0"]),
        ({"value": "50"}, "'pod'", ["vllm-llama-0"]),
        ({"pod": "vllm-llama-0", "value": "lots"}, "'value'", ["lots", "0 to 100", "auto"]),
        ({"pod": "vllm-llama-0", "value": "150"}, "'value'", ["150", "0 to 100", "auto"]),
        ({"pod": "vllm-llama-0", "value": "-1"}, "'value'", ["-1", "0 to 100"]),
        ({"pod": "vllm-llama-0", "value": "nan"}, "'value'", ["nan", "0 to 100"]),
        ({"pod": "vllm-llama-0"}, "'value'", ["0 to 100", "auto"]),
    ],
)
async def test_a_bad_load_request_gets_400_naming_the_parameter(
    fleet: DemoFleet,
    http: aiohttp.ClientSession,
    query: dict[str, str],
    parameter: str,
    mentions: list[str],
) -> None:
    status, body = await control(http, fleet, "/load", **query)
    assert status == 400
    assert parameter in body["error"]
    for text in mentions:
        assert text in body["error"]
    _, state = await control(http, fleet, "/")
    assert all(p["pinned"] is None for w in state["workloads"] for p in w["pods"])


async def test_control_root_lists_workloads_pods_and_loads(
    fleet: DemoFleet, http: aiohttp.ClientSession
) -> None:
    status, state = await control(http, fleet, "/")
    assert status == 200
    assert state["namespace"] == "demo"
    assert sorted(state["exporters"].values()) == sorted(fleet.exporter_urls)
    assert {w["name"]: [p["name"] for p in w["pods"]] for w in state["workloads"]} == {
        w.name: list(w.pods) for w in fleet.workloads
    }
    printed = utilisation_by_pod(await all_pages(http, fleet))
    for workload in state["workloads"]:
        for pod in workload["pods"]:
            assert pod["load"] == sum(printed[pod["name"]]) / len(printed[pod["name"]])


def test_set_load_names_the_unknown_pod_and_the_known_ones() -> None:
    fleet = DemoFleet(seed=SEED)
    with pytest.raises(ValueError, match="ghost") as caught:
        fleet.set_load("ghost", 50)
    assert not isinstance(caught.value, KeyError)
    assert "vllm-llama-0" in str(caught.value) and "trainer-0" in str(caught.value)
    with pytest.raises(ValueError, match="0 to 100"):
        fleet.set_load("trainer-0", 101)


async def test_loads_move_with_the_clock_and_activity_flips_within_minutes(
    fleet: DemoFleet, clock: FakeClock, http: aiohttp.ClientSession
) -> None:
    step_s = 5
    sums: dict[str, list[float]] = {w.name: [] for w in fleet.workloads}
    for elapsed in range(0, 301, step_s):  # five simulated minutes, no sleeping
        clock.now = START + elapsed
        printed = utilisation_by_pod(await all_pages(http, fleet))
        for workload in fleet.workloads:
            sums[workload.name].append(sum(sum(printed[pod]) / len(printed[pod]) for pod in workload.pods))

    for name in ("vllm-qwen", "vllm-llama"):
        values = sums[name]
        assert min(values) == 0, (name, values)  # idle: would scale to zero
        assert max(values) >= 150, (name, values)  # well above a threshold of 60 per pod
        assert len(set(values)) > 20, (name, values)  # it moves, not a step function
        active = [value > 0 for value in values]
        flips = [i for i in range(1, len(active)) if active[i] != active[i - 1]]
        assert len(flips) >= 2, (name, values)
        # Activity never stays the same for more than two minutes.
        runs = [b - a for a, b in zip([0, *flips], [*flips, len(active)], strict=True)]
        assert max(runs[1:-1], default=0) * step_s <= 120, (name, values)
    # Training runs near 100 % but pauses for checkpoints.
    assert max(sums["trainer"]) >= 90 and min(sums["trainer"]) <= 5


def test_memory_is_flat_for_vllm_and_moves_for_training(clock: FakeClock) -> None:
    fleet = DemoFleet(clock=clock, seed=SEED)
    ratios: dict[str, list[float]] = {}
    for elapsed in range(0, 301, 10):
        clock.now = START + elapsed
        for node in ("gpu-node-a", "gpu-node-b"):
            page = fleet.render_page(node)
            used = {
                s.labels["UUID"]: (s.value, s.labels.get("pod")) for s in samples(page, "DCGM_FI_DEV_FB_USED")
            }
            free = {s.labels["UUID"]: s.value for s in samples(page, "DCGM_FI_DEV_FB_FREE")}
            reserved = {s.labels["UUID"]: s.value for s in samples(page, "DCGM_FI_DEV_FB_RESERVED")}
            for uuid, (value, pod) in used.items():
                if pod:
                    ratios.setdefault(pod, []).append(value / (value + free[uuid] + reserved[uuid]))
        page = fleet.render_page("mi300x-node-1")
        total = {s.labels["gpu_id"]: s.value for s in samples(page, "gpu_total_vram")}
        for sample in samples(page, "gpu_used_vram"):
            if sample.labels["pod"]:
                ratios.setdefault(sample.labels["pod"], []).append(
                    sample.value / total[sample.labels["gpu_id"]]
                )
    for pod, values in ratios.items():
        if pod.startswith("vllm-"):
            assert all(0.88 <= value <= 0.92 for value in values), (pod, values)
    assert max(ratios["trainer-0"]) - min(ratios["trainer-0"]) > 0.05


def test_pages_depend_only_on_seed_clock_and_pins(clock: FakeClock) -> None:
    first, second, other = (DemoFleet(clock=clock, seed=s) for s in (SEED, SEED, SEED + 1))
    for elapsed in (0.0, 61.5, 250.0):
        clock.now = START + elapsed
        for node in first.nodes:
            assert first.render_page(node) == second.render_page(node)
            assert first.render_page(node) != other.render_page(node)
    with pytest.raises(ValueError, match="gpu-node-a"):
        first.render_page("gpu-node-z")


async def test_stop_closes_every_server(clock: FakeClock, http: aiohttp.ClientSession) -> None:
    fleet = DemoFleet(clock=clock, seed=SEED)
    await fleet.start()
    urls = [*fleet.exporter_urls, fleet.control_url + "/"]
    await fetch(http, urls[0])
    await fleet.stop()
    for url in urls:
        with pytest.raises(aiohttp.ClientConnectionError):
            async with http.get(url):
                pass
    with pytest.raises(RuntimeError):
        _ = fleet.exporter_urls
    await fleet.stop()  # a second stop is harmless


# -- inference servers ---------------------------------------------------------------------------------


def inference_url(fleet: DemoFleet, pod: str) -> str:
    return next(url for _, name, url in fleet.inference_urls if name == pod)


async def reading_of(http: aiohttp.ClientSession, fleet: DemoFleet, pod: str) -> InferenceReading:
    """What the scaler reads from the pod's own page: parsed and read as it does."""
    page = await fetch(http, inference_url(fleet, pod))
    assert list(text_string_to_metric_families(page)) or page == ""  # valid text exposition
    return pod_reading(parse_exposition(page, reject_conflicts=True))


def inference_pods(fleet: DemoFleet) -> list[str]:
    return [pod for workload in fleet.inference_workloads for pod in workload.pods]


async def test_inference_workloads_and_their_urls(fleet: DemoFleet) -> None:
    workloads = {w.name: w for w in fleet.inference_workloads}
    assert set(workloads) == {"vllm-chat", "sglang-code"}
    chat = workloads["vllm-chat"]
    assert (chat.engine, chat.pods) == ("vllm", ("vllm-chat-0", "vllm-chat-1", "vllm-chat-2"))
    assert chat.engines_per_pod == (2, 1, 1)  # one data-parallel pod
    assert workloads["sglang-code"].engine == "sglang" and len(workloads["sglang-code"].pods) == 2
    # Never a GPU workload's prefix: the requests triggers see only their own pods.
    gpu_pods = [pod for w in fleet.workloads for pod in w.pods]
    for workload in fleet.inference_workloads:
        assert not [pod for pod in gpu_pods if pod.startswith(workload.name + "-")]
    urls = fleet.inference_urls
    assert [(ns, pod) for ns, pod, _ in urls] == [("demo", pod) for pod in inference_pods(fleet)]
    for _, pod, url in urls:
        assert url == f"{fleet.control_url}/pods/{pod}/metrics"


async def test_every_inference_pod_serves_its_engines_page(
    clock: FakeClock, fleet: DemoFleet, http: aiohttp.ClientSession
) -> None:
    clock.now = START + 60.0  # every engine is up, in the first burst
    engines = {"vllm-chat-0": 2, "vllm-chat-1": 1, "vllm-chat-2": 1, "sglang-code-0": 1, "sglang-code-1": 1}
    for pod in inference_pods(fleet):
        async with http.get(inference_url(fleet, pod)) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        reading = await reading_of(http, fleet, pod)
        expected_engine = Engine.VLLM if pod.startswith("vllm-") else Engine.SGLANG
        assert reading.engine is expected_engine, pod
        # SGLang's tensor-parallel ranks repeat one engine: still one engine.
        assert reading.engines == engines[pod], pod
        now = fleet.pod_requests(pod)
        assert now is not None
        assert (reading.running, reading.waiting) == (now.running, now.waiting), pod
        assert reading.kv_cache == pytest.approx(now.kv_cache), pod
        assert isinstance(reading.running, float) and reading.running > 0, pod


async def test_a_starting_vllm_pod_prints_no_vllm_family_until_its_engine_is_up(
    clock: FakeClock, fleet: DemoFleet, http: aiohttp.ClientSession
) -> None:
    page = await fetch(http, inference_url(fleet, "vllm-chat-2"))
    assert "vllm:" not in page
    starting = await reading_of(http, fleet, "vllm-chat-2")
    assert starting.engine is None
    assert isinstance(starting.running, Missing) and isinstance(starting.waiting, Missing)
    assert fleet.pod_requests("vllm-chat-2") is None
    _, state = await control(http, fleet, "/")
    chat = next(w for w in state["inference_workloads"] if w["name"] == "vllm-chat")
    assert [p["started"] for p in chat["pods"]] == [True, True, False]
    clock.now = START + 25.0
    assert (await reading_of(http, fleet, "vllm-chat-2")).engine is Engine.VLLM


async def test_unknown_inference_pod_page_is_404(fleet: DemoFleet, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{fleet.control_url}/pods/vllm-chat-9/metrics") as response:
        assert response.status == 404
        assert "vllm-chat-0" in await response.text()
    async with http.get(f"{fleet.control_url}/pods/trainer-0/metrics") as response:
        assert response.status == 404  # a GPU pod has no inference server


async def test_load_pins_an_inference_pods_running_and_waiting_requests(
    clock: FakeClock, fleet: DemoFleet, http: aiohttp.ClientSession
) -> None:
    twin = DemoFleet(clock=clock, seed=SEED)  # never pinned, started at the same time
    clock.now = START + 30.0
    status, body = await control(http, fleet, "/load", pod="vllm-chat-0", running="12", waiting="30")
    assert status == 200, body
    assert body["changed"] == {
        "pod": "vllm-chat-0",
        "pinned": {"running": 12, "waiting": 30, "kv_cache": None},
    }
    listed = {p["name"]: p for w in body["inference_workloads"] for p in w["pods"]}
    assert (listed["vllm-chat-0"]["running"], listed["vllm-chat-0"]["waiting"]) == (12, 30)
    # The other engine of the pair and the other pods keep moving.
    status, body = await control(http, fleet, "/load", pod="sglang-code-1", waiting="7")
    assert status == 200, body
    assert body["changed"]["pinned"] == {"running": 0, "waiting": 7, "kv_cache": None}

    for elapsed in (30.0, 61.0, 150.0):  # pinned means pinned, bursts and nights alike
        clock.now = START + elapsed
        chat = await reading_of(http, fleet, "vllm-chat-0")
        assert (chat.running, chat.waiting, chat.engines) == (12.0, 30.0, 2)
        page = await fetch(http, inference_url(fleet, "vllm-chat-0"))
        # Spread over the two data-parallel engines, as a balancer would.
        assert (
            'vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 6.0' in page
        )
        assert (
            'vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 15.0' in page
        )
        code = await reading_of(http, fleet, "sglang-code-1")
        assert (code.running, code.waiting) == (0.0, 7.0)
        assert code.kv_cache == 0.0

    # value=N: N requests in flight, as the server splits them (a batch limit of 24 per engine).
    status, body = await control(http, fleet, "/load", pod="vllm-chat-1", value="40", kv_cache="85")
    assert status == 200, body
    assert body["changed"]["pinned"] == {"running": 24, "waiting": 16, "kv_cache": 85.0}
    one = await reading_of(http, fleet, "vllm-chat-1")
    assert (one.running, one.waiting) == (24.0, 16.0)
    assert one.kv_cache == pytest.approx(85.0)

    status, body = await control(http, fleet, "/load", pod="vllm-chat-0", value="auto")
    assert status == 200, body
    assert body["changed"] == {"pod": "vllm-chat-0", "pinned": None}
    # The gauges follow the moving pattern again; the counters keep what the pin made them count.
    assert without_counters(await fetch(http, inference_url(fleet, "vllm-chat-0"))) == without_counters(
        twin.render_inference_page("vllm-chat-0")
    )
    # GPU pods are untouched by all this.
    assert fleet.render_page("gpu-node-b") == twin.render_page("gpu-node-b")


@pytest.mark.parametrize(
    ("query", "mentions"),
    [
        ("pod=vllm-chat-0&running=-1", ["'running'", "-1", "0 to 10000"]),
        ("pod=vllm-chat-0&running=1.5", ["'running'", "1.5", "whole number"]),
        ("pod=vllm-chat-0&waiting=lots", ["'waiting'", "lots", "whole number"]),
        ("pod=vllm-chat-0&waiting=10001", ["'waiting'", "10001", "out of range"]),
        ("pod=vllm-chat-0&running=nan", ["'running'", "nan"]),
        ("pod=vllm-chat-0", ["'running'", "'waiting'", "value=auto"]),
        ("pod=vllm-chat-0&kv_cache=50", ["kv_cache", "running"]),
        ("pod=vllm-chat-0&running=3&kv_cache=150", ["'kv_cache'", "150", "0 to 100"]),
        ("pod=vllm-chat-0&running=3&kv_cache=full", ["'kv_cache'", "full", "0 to 100"]),
        ("pod=vllm-chat-0&value=auto&running=3", ["auto", "'running'"]),
        ("pod=vllm-chat-0&value=5&waiting=3", ["'value'", "'waiting'", "give one"]),
        ("pod=vllm-chat-0&value=95%25", ["'value'", "95%"]),
        ("pod=vllm-chat-0&runing=3", ["'runing'", "running", "waiting"]),
        ("pod=vllm-chat-0&running=3&running=4", ["'running'", "more than once"]),
        ("pod=vllm-chat-7&running=3", ["'pod'", "vllm-chat-7", "vllm-chat-0", "sglang-code-0", "trainer-0"]),
        ("pod=trainer-0&running=3", ["'running'", "trainer-0", "value=PERCENT", "vllm-chat-0"]),
        ("running=3&waiting=4", ["'pod'", "vllm-chat-0"]),
    ],
)
async def test_a_bad_inference_load_request_gets_400_naming_the_parameter(
    fleet: DemoFleet, http: aiohttp.ClientSession, query: str, mentions: list[str]
) -> None:
    status, body = await control_raw(http, fleet, query)
    assert status == 400, body
    for text in mentions:
        assert text in body["error"], (text, body["error"])
    _, state = await control(http, fleet, "/")
    assert all(p["pinned"] is None for w in state["inference_workloads"] for p in w["pods"])
    assert all(p["pinned"] is None for w in state["workloads"] for p in w["pods"])


def test_set_requests_and_set_load_check_their_arguments() -> None:
    fleet = DemoFleet(seed=SEED)
    with pytest.raises(ValueError, match="sglang-code-0"):
        fleet.set_requests("ghost", 1, 2)
    with pytest.raises(ValueError, match="whole number"):
        fleet.set_requests("vllm-chat-0", -1, 2)
    with pytest.raises(ValueError, match="whole number"):
        fleet.set_in_flight("vllm-chat-0", 2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="0 to 100"):
        fleet.set_requests("vllm-chat-0", 1, 2, kv_cache_percent=101)
    with pytest.raises(ValueError, match="set_requests"):
        fleet.set_load("vllm-chat-0", 50)
    fleet.set_requests("vllm-chat-0", 1, 2)
    fleet.set_load("vllm-chat-0", None)  # releases


async def test_control_root_lists_inference_workloads_pods_and_loads(
    clock: FakeClock, fleet: DemoFleet, http: aiohttp.ClientSession
) -> None:
    clock.now = START + 65.0
    status, state = await control(http, fleet, "/")
    assert status == 200
    assert "running=N" in state["usage"] and "value=auto" in state["usage"]
    assert {w["name"]: [p["name"] for p in w["pods"]] for w in state["inference_workloads"]} == {
        w.name: list(w.pods) for w in fleet.inference_workloads
    }
    for workload in state["inference_workloads"]:
        assert workload["engine"] in ("vllm", "sglang") and workload["model"]
        for pod in workload["pods"]:
            reading = await reading_of(http, fleet, pod["name"])
            assert pod["url"] == inference_url(fleet, pod["name"])
            assert (pod["running"], pod["waiting"]) == (reading.running, reading.waiting)
            assert pod["kv_cache"] == pytest.approx(reading.kv_cache)
            assert pod["engines"] == reading.engines


async def test_requests_move_with_the_clock_bursts_queue_and_nights_are_idle(
    clock: FakeClock, http: aiohttp.ClientSession
) -> None:
    fleet = DemoFleet(clock=clock, seed=SEED, engine_start_s=0.0)
    step_s = 5
    totals: dict[str, list[float]] = {w.name: [] for w in fleet.inference_workloads}
    waiting: dict[str, list[float]] = {w.name: [] for w in fleet.inference_workloads}
    for elapsed in range(0, 481, step_s):  # eight simulated minutes, no sleeping
        clock.now = START + elapsed
        for workload in fleet.inference_workloads:
            readings = [pod_reading(parse_exposition(fleet.render_inference_page(p))) for p in workload.pods]
            running_now, waiting_now = 0.0, 0.0
            for reading in readings:
                assert isinstance(reading.kv_cache, float) and 0 <= reading.kv_cache <= 100
                assert isinstance(reading.running, float) and isinstance(reading.waiting, float)
                running_now += reading.running
                waiting_now += reading.waiting
            totals[workload.name].append(running_now + waiting_now)
            waiting[workload.name].append(waiting_now)
    threshold = float(INFERENCE_THRESHOLD)
    for name, values in totals.items():
        assert min(values) == 0, (name, values)  # nobody asking: idle, would scale to zero
        assert max(values) >= 4 * threshold, (name, values)  # a burst calls for several replicas
        assert len(set(values)) > 20, (name, values)  # it moves, not a step function
        assert max(waiting[name]) > 0, (name, waiting[name])  # bursts queue behind the batch limit
        active = [value > 0 for value in values]
        assert sum(1 for a, b in itertools.pairwise(active) if a != b) >= 2, (name, values)


async def test_banner_shows_a_requests_trigger_and_an_inference_pods_load(fleet: DemoFleet) -> None:
    text = banner(fleet, 6000, 8080)
    assert '"metricName":"inference-requests"' in text
    assert '"metric":"requests"' in text and '"podNamePrefix":"vllm-chat-"' in text
    assert "-emit-defaults" in text
    # The grpcurl `make run` installs beside the interpreter, named so that it runs from any terminal.
    beside = Path(sys.executable).with_name("grpcurl")
    if beside.is_file():
        assert f"  {beside} -plaintext 127.0.0.1:6000 list" in text
    assert f"{fleet.control_url}/load?pod=vllm-chat-0&running=12&waiting=30" in text
    assert f"{fleet.control_url}/pods/vllm-chat-0/metrics" in text
    for workload in fleet.workloads:
        pods = len(workload.pods)
        assert f"{workload.name} ({workload.vendor}, {pods} {'pod' if pods == 1 else 'pods'} x" in text
    assert any(len(w.pods) == 1 for w in fleet.workloads)  # the singular is seen
    names = [target.name for target in demo_targets(fleet)]
    assert names == [
        *(w.name for w in fleet.workloads),
        *(w.name for w in fleet.inference_workloads),
        *(p.workload for p in fleet.gateway.pools),
    ]


DEMO_SCALER = Settings(
    grpc_address="127.0.0.1:0",
    http_address="127.0.0.1:0",
    kubernetes="off",
    scrape_interval=0.2,
    max_staleness=0.6,
    scrape_timeout=0.5,
    shutdown_grace=2.0,
)


async def test_the_demo_scaler_answers_a_requests_trigger_with_the_pods_total_in_flight(
    http: aiohttp.ClientSession,
) -> None:
    fleet = DemoFleet(seed=SEED, engine_start_s=0.0)
    await fleet.start()
    app = App(demo_settings(DEMO_SCALER, fleet))
    await app.start()
    try:
        chat = next(w for w in fleet.inference_workloads if w.name == "vllm-chat")
        pins = {"vllm-chat-0": (12, 30), "vllm-chat-1": (5, 0), "vllm-chat-2": (24, 3)}
        for pod, (running, waiting) in pins.items():
            status, body = await control(
                http, fleet, "/load", pod=pod, running=str(running), waiting=str(waiting)
            )
            assert status == 200, body
        expected = sum(running + waiting for running, waiting in pins.values())  # 74
        ref = pb.ScaledObjectRef(
            name=chat.name, namespace=fleet.NAMESPACE, scalerMetadata=inference_metadata(chat)
        )
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
            stub = pb_grpc.ExternalScalerStub(channel)
            spec = await stub.GetMetricSpec(ref)
            assert [(m.metricName, m.targetSizeFloat) for m in spec.metricSpecs] == [
                (REQUESTS_METRIC_NAME, float(INFERENCE_THRESHOLD))
            ]

            async def value() -> None:
                answer = await stub.GetMetrics(
                    pb.GetMetricsRequest(scaledObjectRef=ref, metricName=REQUESTS_METRIC_NAME)
                )
                assert [(m.metricName, m.metricValueFloat, m.metricValue) for m in answer.metricValues] == [
                    (REQUESTS_METRIC_NAME, expected, expected)
                ]

            await eventually(value)
            assert (await stub.IsActive(ref)).result is True
            # ceil(74 / 16) = 5 replicas, in one step.
            target = DemoTarget(chat.name, inference_metadata(chat), REQUESTS_METRIC_NAME, "requests")
            line = await status_line(app, fleet, stub, target)
            assert "requests" in line and f"value {expected:7.1f}" in line and "HPA wants 5" in line, line

            # Every pod idle: 0 in flight, inactive — a 0 that was measured, not made up.
            for pod in pins:
                await control(http, fleet, "/load", pod=pod, running="0", waiting="0")

            async def idle() -> None:
                answer = await stub.GetMetrics(
                    pb.GetMetricsRequest(scaledObjectRef=ref, metricName=REQUESTS_METRIC_NAME)
                )
                assert answer.metricValues[0].metricValueFloat == 0
                assert (await stub.IsActive(ref)).result is False

            await eventually(idle)
    finally:
        await app.stop()
        await fleet.stop()


async def test_the_status_lines_cover_gpu_and_inference_workloads() -> None:
    fleet = DemoFleet(seed=SEED, engine_start_s=0.0)
    await fleet.start()
    app = App(demo_settings(DEMO_SCALER, fleet))
    await app.start()
    out = io.StringIO()
    task = asyncio.create_task(watch(app, fleet, 0.05, out))
    try:

        async def every_workload_has_a_value() -> None:
            lines = out.getvalue().splitlines()
            for workload in fleet.workloads:
                assert any(re.match(rf"{workload.name} +GPU % +value ", line) for line in lines), lines
            # `demand` from start-up (the README's Try-it asks vllm-chat). The simulated SGLang, like the
            # real one, prints its counter of finished requests only once one has finished.
            assert any(re.match(r"vllm-chat +req/s +value ", line) for line in lines), lines
            for llm in fleet.inference_workloads:
                assert any(re.match(rf"{llm.name} +req/s ", line) for line in lines), lines

        await eventually(every_workload_has_a_value)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await app.stop()
        await fleet.stop()


COUNTERS = ("vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total")


def without_counters(page: str) -> str:
    return "\n".join(line for line in page.splitlines() if not any(name in line for name in COUNTERS))


def finished_total(page: str) -> float:
    return sum(s.value for s in parse_exposition(page) if s.name == "vllm:request_success_total")


def test_vllm_pages_count_finished_requests_as_the_batch_runs(clock: FakeClock) -> None:
    """The counters `metric: demand` reads: 20 requests in the batch finish at 20 / 10 s = 2 a second."""
    fleet = DemoFleet(clock=clock, seed=SEED, engine_start_s=0.0)
    pod = "vllm-chat-0"
    fleet.set_requests(pod, 20, 0)
    clock.now += 5
    before = finished_total(fleet.render_inference_page(pod))
    clock.now += 30
    after = finished_total(fleet.render_inference_page(pod))
    assert after - before == pytest.approx(60, abs=2)
    fleet.set_requests(pod, 0, 0)  # idle: the counter stands still
    clock.now += 30
    assert finished_total(fleet.render_inference_page(pod)) == pytest.approx(after, abs=2)


@pytest.mark.parametrize("workload", ["vllm-chat", "sglang-code"])
async def test_the_demo_scaler_answers_a_demand_trigger_with_the_arrival_rate(workload: str) -> None:
    """Both engines' pages print the counters `demand` reads (SGLang's once a request has finished)."""
    fleet = DemoFleet(seed=SEED, engine_start_s=0.0)
    await fleet.start()
    app = App(demo_settings(DEMO_SCALER, fleet))
    await app.start()
    try:
        chat = next(w for w in fleet.inference_workloads if w.name == workload)
        for pod in chat.pods:
            fleet.set_requests(pod, 20, 0)
        ref = pb.ScaledObjectRef(
            name=chat.name, namespace=fleet.NAMESPACE, scalerMetadata=demand_metadata(chat)
        )
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
            stub = pb_grpc.ExternalScalerStub(channel)

            async def a_rate() -> None:
                answer = await stub.GetMetrics(
                    pb.GetMetricsRequest(scaledObjectRef=ref, metricName=DEMAND_METRIC_NAME)
                )
                # Counters move in whole seconds of simulated time: a positive rate once two scrapes apart.
                assert answer.metricValues[0].metricValueFloat > 0

            await eventually(a_rate, timeout=30)
            assert (await stub.IsActive(ref)).result is True
    finally:
        await app.stop()
        await fleet.stop()
