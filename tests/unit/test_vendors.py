"""Table tests for the vendor layer: exporter pages in tests/fixtures/ → exact per-pod GPU readings."""

from __future__ import annotations

from dataclasses import astuple
from pathlib import Path

import pytest

from keda_gpu_scaler.pages.exposition import Sample, parse_exposition
from keda_gpu_scaler.pages.vendors import (
    SAMPLE_NAMES,
    VENDORS,
    Family,
    GpuReading,
    NvidiaField,
    readings_from_samples,
    utilization_for,
)

FIXTURES = Path(__file__).parent.parent / "fixtures"


def read(page: str, through_prometheus: bool = False) -> list[GpuReading]:
    return readings_from_samples(parse_exposition(page, SAMPLE_NAMES), through_prometheus=through_prometheus)


def read_fixture(name: str) -> list[GpuReading]:
    # prometheus_*.prom: series as Prometheus stores them (its /federate output), the others exporters' pages.
    return read((FIXTURES / name).read_text(), through_prometheus=name.startswith("prometheus_"))


def assert_readings(actual: list[GpuReading], expected: list[GpuReading]) -> None:
    assert [astuple(r) for r in actual] == [pytest.approx(astuple(r)) for r in expected]


def nvidia(
    namespace: str,
    pod: str,
    gpu: str,
    host: str,
    *,
    util: float | None,
    engine: float | None,
    memory: float | None,
    mig: bool = False,
) -> GpuReading:
    return GpuReading(Family.NVIDIA, namespace, pod, gpu, host, util, engine, mig, memory)


def amd(
    namespace: str, pod: str, gpu: str, host: str, *, util: float | None, memory: float | None
) -> GpuReading:
    return GpuReading(Family.AMD, namespace, pod, gpu, host, util, None, False, memory)


def ack(
    namespace: str, pod: str, gpu: str, host: str, *, util: float | None, memory: float | None
) -> GpuReading:
    return GpuReading(Family.ACK, namespace, pod, gpu, host, util, None, False, memory)


H100_0 = "GPU-8b2281de-6d3c-22ed-0ec8-d3b864870b8b"
A100 = [
    "GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
    "GPU-1a2b3c4d-5e6f-7081-92a3-b4c5d6e7f809",
    "GPU-2b3c4d5e-6f70-8192-a3b4-c5d6e7f8091a",
    "GPU-3c4d5e6f-7081-92a3-b4c5-d6e7f8091a2b",
]
MIG_H100 = "GPU-be839661-c0f5-7452-284b-b875666df60c"
MIG_A100 = "GPU-9c1f0a77-3e2d-41b8-a6c5-7d2e8f4b1a90"
L4 = ["GPU-3f6c2b1a-9d8e-4c7b-a6f5-e4d3c2b1a098", "GPU-4a7d3c2b-0e9f-5d8c-b706-f5e4d3c2b1a9"]
L4_TOTAL = 15012 + 7422 + 600  # device-level FB_USED + FB_FREE + FB_RESERVED of GPU 0 (and of GPU 1)
ACK_NODE = "cn-hangzhou.192.168.0.12"
ACK_GPU = ["GPU-5d1e7c2a-3b4f-9e8d-7c6b-5a4f3e2d1c0b", "GPU-6e2f8d3b-4c5a-0f9e-8d7c-6b5a4f3e2d1c"]
TRAINER = "trainer-5c9f7d8b9-qp2xz"

VIRTUAL_GPU_READINGS = [
    # Time-sliced pods: their own per-process GPU_UTIL/FB_USED, memory over the whole GPU; the
    # GR_ENGINE_ACTIVE copies on GPU 0 belong to neither pod alone.
    nvidia(
        "ml", "chat-7f6d9c5b8-abcde", L4[0], "l4-node-5", util=48, engine=None, memory=9000 / L4_TOTAL * 100
    ),
    nvidia(
        "ml", "chat-7f6d9c5b8-fghij", L4[0], "l4-node-5", util=23, engine=None, memory=5500 / L4_TOTAL * 100
    ),
    # The only pod on GPU 1: the device value copied onto it is its own.
    nvidia(
        "ml", "embed-6b5c4d3e2-klmno", L4[1], "l4-node-5", util=40, engine=38.1, memory=5800 / 23034 * 100
    ),
]

FIXTURE_CASES = [
    pytest.param(
        "dcgm_2xh100.prom",
        [
            nvidia(
                "llm",
                "vllm-qwen-7d9c8b6f5d-x2k4p",
                H100_0,
                "gpu-node-a",
                util=87,
                engine=81.2345,
                memory=73841 / (73841 + 7238 + 480) * 100,
            )
        ],
        id="dcgm-2xH100-one-pod-one-idle",
    ),
    pytest.param(
        "dcgm_4gpu_pod.prom",
        [
            nvidia("research", TRAINER, A100[0], "dgx-a100-07", util=90, engine=91.2004, memory=75.0),
            nvidia("research", TRAINER, A100[1], "dgx-a100-07", util=80, engine=80.3311, memory=62.5),
            nvidia("research", TRAINER, A100[2], "dgx-a100-07", util=70, engine=69.987, memory=50.0),
            nvidia("research", TRAINER, A100[3], "dgx-a100-07", util=60, engine=60.1245, memory=37.5),
        ],
        id="dcgm-4-gpu-pod-lowercase-hostname",
    ),
    pytest.param(
        "dcgm_mig_no_gpu_util.prom",
        [
            nvidia(
                "llm",
                "embedder-0",
                f"{MIG_H100}/11",
                "gpu-node-b",
                util=None,
                engine=41.238,
                memory=6144 / 9728 * 100,
                mig=True,
            ),
            nvidia(
                "llm",
                "embedder-1",
                f"{MIG_H100}/12",
                "gpu-node-b",
                util=None,
                engine=5.1002,
                memory=5120 / 9728 * 100,
                mig=True,
            ),
            nvidia(
                "llm",
                "reranker-0",
                f"{MIG_H100}/2",
                "gpu-node-b",
                util=None,
                engine=66.0214,
                memory=30208 / 40320 * 100,
                mig=True,
            ),
        ],
        id="dcgm-mig-gpu-util-absent",
    ),
    pytest.param(
        "dcgm_mig_gpu_util_zero.prom",
        [
            nvidia(
                "speech",
                "asr-0",
                f"{MIG_A100}/1",
                "gpu-node-c",
                util=0,
                engine=55.0,
                memory=15360 / 20224 * 100,
                mig=True,
            ),
            nvidia(
                "speech",
                "asr-1",
                f"{MIG_A100}/2",
                "gpu-node-c",
                util=0,
                engine=12.4873,
                memory=50.0,
                mig=True,
            ),
        ],
        id="dcgm-mig-gpu-util-zero",
    ),
    pytest.param(
        "dcgm_old_namespace.prom",
        [
            nvidia(
                "audio",
                "whisper-0",
                "GPU-d3b07384-d113-4ec6-a27b-0a1c2e3f4a5b",
                "v100-node-3",
                util=57,
                engine=49.8812,
                memory=20000 / 32500 * 100,
            )
        ],
        id="dcgm-use-old-namespace-no-fb-reserved",
    ),
    pytest.param(
        "dcgm_empty_pod_labels.prom",
        [
            nvidia(
                "docs",
                "ocr-6d5f8c7b9-4kq2m",
                "GPU-6bf47ca9-ad3e-15db-beed-1079a7d74116",
                "t4-node-1",
                util=64,
                engine=None,
                memory=9000 / 15109 * 100,
            )
        ],
        id="dcgm-older-release-empty-pod-labels",
    ),
    pytest.param(
        "dcgm_fb_total.prom",
        [
            nvidia(
                "vision",
                "detector-84d6b7c9f5-zx7lm",
                "GPU-a1b2c3d4-e5f6-0718-293a-4b5c6d7e8f90",
                "l40s-node-2",
                util=33,
                engine=28.7761,
                memory=23034 / 46068 * 100,  # over FB_TOTAL, not FB_USED + FB_FREE
            )
        ],
        id="dcgm-fb-total",
    ),
    pytest.param("dcgm_virtual_gpus.prom", VIRTUAL_GPU_READINGS, id="dcgm-virtual-gpus"),
    pytest.param(
        "dcgm_virtual_gpus_pod_uid.prom", VIRTUAL_GPU_READINGS, id="dcgm-virtual-gpus-copies-with-pod-uid"
    ),
    pytest.param(
        "prometheus_federate_dcgm.prom",
        [
            # Idle GPUs carry only the exporter's own pod as target labels: no reading for them.
            nvidia(
                "images",
                "sdxl-6f7d8c9b5-abcde",
                "GPU-c0ffee00-1111-2222-3333-444455556666",
                "gpu-node-7",
                util=93,
                engine=None,
                memory=52011 / 81334 * 100,
            ),
            nvidia(
                "images",
                "sdxl-6f7d8c9b5-fghij",
                "GPU-c0ffee02-1111-2222-3333-444455556666",
                "gpu-node-8",
                util=41,
                engine=None,
                memory=40960 / 81334 * 100,
            ),
        ],
        id="through-prometheus-exported-labels",
    ),
    pytest.param(
        "dcgm_same_pod_two_namespaces.prom",
        [
            nvidia(
                "team-a",
                "worker-0",
                "GPU-aa11bb22-cc33-dd44-ee55-ff6677889900",
                "a10-node-4",
                util=35,
                engine=None,
                memory=50.0,
            ),
            nvidia(
                "team-b",
                "worker-0",
                "GPU-bb22cc33-dd44-ee55-ff66-778899001122",
                "a10-node-4",
                util=95,
                engine=None,
                memory=25.0,
            ),
        ],
        id="same-pod-name-two-namespaces",
    ),
    pytest.param(
        "amd_mi300x.prom",
        [
            amd("llm", "vllm-llama-0", "0", "mi300x-node-1", util=73, memory=178532 / 196592 * 100),
            amd("research", "trainer-0", "2", "mi300x-node-1", util=55, memory=50.0),
            amd("research", "trainer-0", "3", "mi300x-node-1", util=61, memory=75.0),
        ],
        id="amd-no-prefix-several-gpus-per-pod",
    ),
    pytest.param(
        "amd_mi300x_prefixed.prom",
        [amd("chat", "sglang-0", "0", "pool-mi300x-7k2m9", util=12, memory=181043 / 196592 * 100)],
        id="amd-prefixed",
    ),
    pytest.param(
        "ack_gpushare.prom",
        [
            # Two processes of infer-a on GPU 0: 30 + 25 SM, (4000 + 2000) MiB of its 8192 MiB.
            ack(
                "inference",
                "infer-a-5c7d8f9b6-q2w3e",
                ACK_GPU[0],
                ACK_NODE,
                util=55,
                memory=6000 / 8192 * 100,
            ),
            ack(
                "inference",
                "infer-b-7f8a9b0c1-r4t5y",
                ACK_GPU[0],
                ACK_NODE,
                util=20,
                memory=3000 / 8192 * 100,
            ),
            ack("research", "train-0", ACK_GPU[1], ACK_NODE, util=88, memory=20000 / 23028 * 100),
            # The same page's DCGM_FI_* families, returned beside them for the scaling code to set aside.
            nvidia(
                "inference",
                "infer-a-5c7d8f9b6-q2w3e",
                ACK_GPU[0],
                ACK_NODE,
                util=79,
                engine=None,
                memory=9500 / 23028 * 100,
            ),
            nvidia(
                "research", "train-0", ACK_GPU[1], ACK_NODE, util=91, engine=None, memory=20250 / 23028 * 100
            ),
        ],
        id="ack-gpu-sharing-with-dcgm-families",
    ),
]


@pytest.mark.parametrize(("fixture", "expected"), FIXTURE_CASES)
def test_fixture_pages(fixture: str, expected: list[GpuReading]) -> None:
    assert_readings(read_fixture(fixture), expected)


def test_every_fixture_is_covered() -> None:
    covered = {case.values[0] for case in FIXTURE_CASES}
    assert covered == {path.name for path in FIXTURES.glob("*.prom")}


# Small pages for the rules no real exporter page shows on its own.
DCGM_LABELS = 'gpu="0",UUID="GPU-1",device="nvidia0",modelName="NVIDIA L4",Hostname="n1"'
POD = 'container="c",namespace="ns",pod="p"'
TARGET = 'namespace="gpu-operator",pod="dcgm-x"'  # the exporter's own pod, as Prometheus target labels
ACK = 'NamespaceName="ns",UUID="GPU-1",NodeName="n"'

INLINE_CASES = [
    pytest.param(
        f"""
DCGM_FI_DEV_GPU_UTIL{{{DCGM_LABELS},{POD}}} NaN
DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{DCGM_LABELS},{POD}}} +Inf
DCGM_FI_DEV_FB_USED{{{DCGM_LABELS},{POD}}} 100
DCGM_FI_DEV_FB_FREE{{{DCGM_LABELS},{POD}}} -Inf
""",
        [nvidia("ns", "p", "GPU-1", "n1", util=None, engine=None, memory=None)],
        id="nan-inf-dropped-pod-still-known",
    ),
    pytest.param(
        f"""
DCGM_FI_DEV_GPU_UTIL{{{DCGM_LABELS},{POD}}} 104
DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{DCGM_LABELS},{POD}}} -0.01
DCGM_FI_DEV_FB_USED{{{DCGM_LABELS},{POD}}} 100
DCGM_FI_DEV_FB_TOTAL{{{DCGM_LABELS},{POD}}} 50
""",
        [nvidia("ns", "p", "GPU-1", "n1", util=100, engine=0, memory=100)],
        id="nvidia-clamped",
    ),
    pytest.param(
        f"""
DCGM_FI_DEV_GPU_UTIL{{{DCGM_LABELS},{POD},instance="a:9400"}} 50
DCGM_FI_DEV_GPU_UTIL{{{DCGM_LABELS},{POD},instance="b:9400"}} 60
DCGM_FI_DEV_GPU_UTIL{{{DCGM_LABELS},{POD},instance="c:9400"}} NaN
""",
        [nvidia("ns", "p", "GPU-1", "n1", util=60, engine=None, memory=None)],
        id="nvidia-duplicate-series-last-finite-wins",
    ),
    pytest.param(
        f"""
DCGM_FI_DEV_GPU_UTIL{{{DCGM_LABELS},container="c",namespace="ns",pod="p",vgpu="0"}} 70
DCGM_FI_DEV_GPU_UTIL{{{DCGM_LABELS},container="c",namespace="ns",pod="q",vgpu="1"}} 70
DCGM_FI_DEV_FB_USED{{{DCGM_LABELS},container="c",namespace="ns",pod="p",vgpu="0"}} 10
DCGM_FI_DEV_FB_USED{{{DCGM_LABELS},container="c",namespace="ns",pod="q",vgpu="1"}} 10
DCGM_FI_DEV_FB_FREE{{{DCGM_LABELS},container="c",namespace="ns",pod="p",vgpu="0"}} 10
DCGM_FI_DEV_FB_FREE{{{DCGM_LABELS},container="c",namespace="ns",pod="q",vgpu="1"}} 10
""",
        [
            nvidia("ns", "p", "GPU-1", "n1", util=None, engine=None, memory=None),
            nvidia("ns", "q", "GPU-1", "n1", util=None, engine=None, memory=None),
        ],
        id="nvidia-shared-gpu-only-device-copies",
    ),
    pytest.param(
        f"""
DCGM_FI_DEV_GPU_UTIL{{{DCGM_LABELS}}} 80
DCGM_FI_DEV_GPU_UTIL{{{DCGM_LABELS},container="a",namespace="ns",pod="p",pod_uid="u1",vgpu="0"}} 30
DCGM_FI_DEV_GPU_UTIL{{{DCGM_LABELS},container="b",namespace="ns",pod="p",pod_uid="u1",vgpu="0"}} 30
DCGM_FI_DEV_GPU_UTIL{{{DCGM_LABELS},container="c",namespace="ns",pod="q",pod_uid="u2",vgpu="1"}} 45
""",
        [
            nvidia("ns", "p", "GPU-1", "n1", util=30, engine=None, memory=None),
            nvidia("ns", "q", "GPU-1", "n1", util=45, engine=None, memory=None),
        ],
        id="nvidia-per-pod-value-printed-per-container-counts-once",
    ),
    pytest.param(
        f"""
DCGM_FI_DEV_GPU_UTIL{{{DCGM_LABELS},{TARGET},exported_namespace="ns",exported_pod="p"}} 20
DCGM_FI_DEV_GPU_UTIL{{gpu="1",UUID="GPU-2",Hostname="n1",{TARGET}}} 0
DCGM_FI_DEV_GPU_UTIL{{UUID="GPU-3",Hostname="n1",exported_pod="",pod_namespace="ns",pod_name="r"}} 5
""",
        [
            nvidia("ns", "p", "GPU-1", "n1", util=20, engine=None, memory=None),
            nvidia("ns", "r", "GPU-3", "n1", util=5, engine=None, memory=None),
        ],
        id="pod-label-precedence-and-exporter-target-pod",
    ),
    pytest.param(
        """
gpu_gfx_activity{gpu_id="0",hostname="h",namespace="ns",pod="p"} 101
gpu_used_vram{gpu_id="0",hostname="h",namespace="ns",pod="p"} 1.5e+04
gpu_free_vram{gpu_id="0",hostname="h",namespace="ns",pod="p"} 5e+03
amd_gpu_gfx_activity{gpu_id="1",hostname="h",namespace="ns",pod="p"} 40
amd_gpu_gfx_activity{gpu_id="2",hostname="h",namespace="ns",pod="old"} 40
amd_gpu_gfx_activity{gpu_id="2",hostname="h",namespace="ns",pod="new"} 40
""",
        [
            amd("ns", "new", "2", "h", util=None, memory=None),
            amd("ns", "old", "2", "h", util=None, memory=None),
            amd("ns", "p", "0", "h", util=100, memory=75.0),
            amd("ns", "p", "1", "h", util=40, memory=None),
        ],
        id="amd-clamp-free-fallback-prefix-mixed-two-pods-on-one-gpu",
    ),
    pytest.param(
        f"""
DCGM_CUSTOM_PROCESS_SM_UTIL{{{ACK},PodName="p",ContainerName="c",ProcessId="1",instance="a"}} 70
DCGM_CUSTOM_PROCESS_SM_UTIL{{{ACK},PodName="p",ContainerName="c",ProcessId="1",instance="b"}} 70
DCGM_CUSTOM_PROCESS_SM_UTIL{{{ACK},PodName="p",ContainerName="c",ProcessId="2"}} 60
DCGM_CUSTOM_PROCESS_MEM_USED{{{ACK},PodName="p",ContainerName="c",ProcessId="1"}} 3000
DCGM_CUSTOM_CONTAINER_MEM_ALLOCATED{{{ACK},PodName="p",ContainerName="c"}} 2000
DCGM_CUSTOM_CONTAINER_MEM_ALLOCATED{{{ACK},PodName="p",ContainerName="d"}} 2000
DCGM_CUSTOM_CONTAINER_MEM_ALLOCATED{{{ACK},PodName="idle",ContainerName="c"}} 4096
DCGM_CUSTOM_PROCESS_SM_UTIL{{{ACK},PodName="nan",ContainerName="c",ProcessId="9"}} NaN
""",
        [
            ack("ns", "idle", "GPU-1", "n", util=0, memory=0),
            ack("ns", "nan", "GPU-1", "n", util=None, memory=None),
            # Process 1 printed twice counts once: 70 + 60 clamps to 100; 3000 of 2000 + 2000 MiB.
            ack("ns", "p", "GPU-1", "n", util=100, memory=75.0),
        ],
        id="ack-duplicates-clamp-containers-idle-pod-nan",
    ),
    pytest.param(
        f"""
DCGM_FI_DEV_GPU_UTIL{{{DCGM_LABELS},{POD}}} 10
gpu_gfx_activity{{gpu_id="0",hostname="h",namespace="ns",pod="p"}} 20
DCGM_CUSTOM_PROCESS_SM_UTIL{{NamespaceName="ns",PodName="p",ProcessId="1",UUID="GPU-1",NodeName="n"}} 30
""",
        [
            ack("ns", "p", "GPU-1", "n", util=30, memory=None),
            nvidia("ns", "p", "GPU-1", "n1", util=10, engine=None, memory=None),
            amd("ns", "p", "0", "h", util=20, memory=None),
        ],
        id="families-in-priority-order",
    ),
    pytest.param("", [], id="empty-page"),
]


# Inline pages as Prometheus stores the series (the exporter's own pod in `namespace`/`pod`).
THROUGH_PROMETHEUS = {"pod-label-precedence-and-exporter-target-pod"}


@pytest.mark.parametrize(("page", "expected"), INLINE_CASES)
def test_inline_pages(page: str, expected: list[GpuReading], request: pytest.FixtureRequest) -> None:
    stored = request.node.callspec.id in THROUGH_PROMETHEUS
    assert_readings(read(page, through_prometheus=stored), expected)


def test_accepts_any_iterable_of_samples() -> None:
    samples = parse_exposition((FIXTURES / "dcgm_4gpu_pod.prom").read_text(), SAMPLE_NAMES)
    assert readings_from_samples(iter(samples)) == readings_from_samples(samples)


def test_unfiltered_page_gives_the_same_readings() -> None:
    page = (FIXTURES / "dcgm_2xh100.prom").read_text()
    assert readings_from_samples(parse_exposition(page)) == read(page)


def test_sample_names() -> None:
    assert {
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_RESERVED",
        "DCGM_FI_DEV_FB_TOTAL",
        "gpu_gfx_activity",
        "amd_gpu_gfx_activity",
        "gpu_used_vram",
        "amd_gpu_used_vram",
        "gpu_total_vram",
        "amd_gpu_total_vram",
        "gpu_free_vram",
        "amd_gpu_free_vram",
        "DCGM_CUSTOM_PROCESS_SM_UTIL",
        "DCGM_CUSTOM_PROCESS_MEM_USED",
        "DCGM_CUSTOM_CONTAINER_MEM_ALLOCATED",
    } == SAMPLE_NAMES
    # Each name is read by one vendor only: a shared name would be read twice, once per family.
    assert sum(len(vendor.sample_names) for vendor in VENDORS) == len(SAMPLE_NAMES)


def test_registry_has_one_vendor_per_family_in_priority_order() -> None:
    assert list(Family) == [Family.ACK, Family.NVIDIA, Family.AMD]
    assert [vendor.family for vendor in VENDORS] == list(Family)


def _reading(family: Family, util: float | None, engine: float | None, mig: bool) -> GpuReading:
    return GpuReading(family, "ns", "p", "g", "h", util, engine, mig, None)


AUTO, GPU_UTIL, GR = NvidiaField.AUTO, NvidiaField.GPU_UTIL, NvidiaField.GR_ENGINE_ACTIVE
UTILIZATION_CASES = [
    # (family, utilization, engine_active, mig, field, expected)
    (Family.NVIDIA, 87.0, 81.0, False, AUTO, 87.0),
    (Family.NVIDIA, 87.0, 81.0, False, GPU_UTIL, 87.0),
    (Family.NVIDIA, 87.0, 81.0, False, GR, 81.0),
    (Family.NVIDIA, 0.0, 50.0, False, AUTO, 0.0),
    (Family.NVIDIA, None, 30.0, False, AUTO, 30.0),
    (Family.NVIDIA, None, 30.0, False, GPU_UTIL, None),
    (Family.NVIDIA, 87.0, None, False, GR, None),
    (Family.NVIDIA, None, None, False, AUTO, None),
    (Family.NVIDIA, None, 41.0, True, AUTO, 41.0),
    (Family.NVIDIA, 0.0, 55.0, True, AUTO, 55.0),
    (Family.NVIDIA, 0.0, 55.0, True, GPU_UTIL, 0.0),
    (Family.NVIDIA, 0.0, None, True, AUTO, None),
    (Family.NVIDIA, 35.0, 20.0, True, AUTO, 35.0),
    (Family.AMD, 73.0, None, False, AUTO, 73.0),
    (Family.AMD, 73.0, None, False, GPU_UTIL, 73.0),
    (Family.AMD, 73.0, None, False, GR, 73.0),
    (Family.ACK, 55.0, None, False, GR, 55.0),
    (Family.ACK, 55.0, None, False, AUTO, 55.0),
]


@pytest.mark.parametrize(("family", "util", "engine", "mig", "field", "expected"), UTILIZATION_CASES)
def test_utilization_for(
    family: Family,
    util: float | None,
    engine: float | None,
    mig: bool,
    field: NvidiaField,
    expected: float | None,
) -> None:
    assert utilization_for(_reading(family, util, engine, mig), field) == expected


# ---- through Prometheus: the exporter's own target labels --------------------------------------------

# What a kube-prometheus ServiceMonitor attaches to every series of a dcgm-exporter (or other exporter) pod.
EXPORTER_TARGET = {
    "namespace": "gpu-operator",
    "pod": "nvidia-dcgm-exporter-7xk2p",
    "container": "nvidia-dcgm-exporter",
    "service": "nvidia-dcgm-exporter",
    "endpoint": "gpu-metrics",
    "job": "nvidia-dcgm-exporter",
    "instance": "10.0.0.7:9400",
}


def through_prometheus(
    samples: list[Sample], honor_labels: bool, target: dict[str, str] = EXPORTER_TARGET
) -> list[Sample]:
    """The samples as Prometheus stores them with the exporter's target labels (its scrape rules): with
    honor_labels false a page's label that a target label takes is renamed `exported_<name>`, prefixed
    again while that name is taken (scrape.go, resolveConflictingExposedLabels)."""
    stored = []
    for sample in samples:
        labels = {k: v for k, v in sample.labels.items() if v}  # an empty label is no label
        if honor_labels:
            for name, value in target.items():
                labels.setdefault(name, value)
        else:
            conflicting = sorted(((n, labels[n]) for n in target if n in labels), key=lambda kv: len(kv[0]))
            labels.update(target)
            for name, value in conflicting:
                renamed = f"exported_{name}"
                while renamed in labels:
                    renamed = f"exported_{renamed}"
                labels[renamed] = value
        stored.append(Sample(sample.name, labels, sample.value, sample.timestamp_ms))
    return stored


@pytest.mark.parametrize("honor_labels", [True, False], ids=["honor-labels", "exported-labels"])
@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.glob("*.prom")))
def test_exporter_target_labels_change_no_reading(fixture: str, honor_labels: bool) -> None:
    """The same readings as the page scraped directly, and none for the exporter's own pod: with
    --kubernetes-virtual-gpus the device-level series (now naming the exporter pod) is what tells each
    time-shared pod's own value from copies of the device's."""
    samples = parse_exposition((FIXTURES / fixture).read_text(), SAMPLE_NAMES)
    if not honor_labels and any("exported_pod" in s.labels for s in samples):
        pytest.skip("a page already read through Prometheus: its exported_* labels would be renamed twice")
    direct = read_fixture(fixture)
    stored = readings_from_samples(through_prometheus(samples, honor_labels), through_prometheus=True)
    workloads = [r for r in stored if r.namespace != EXPORTER_TARGET["namespace"]]
    assert workloads == direct
    if any(s.labels.get("pod_uid") for s in samples):
        assert workloads == stored  # the exporter's pod is known: its device-level series are no pod's


def test_exporter_pod_is_told_only_by_device_series_beside_pod_uid_series() -> None:
    device = f'{DCGM_LABELS},namespace="ops",pod="exporter"'
    page = f"""
DCGM_FI_DEV_GPU_UTIL{{{device}}} 80
DCGM_FI_DEV_GPU_UTIL{{{DCGM_LABELS},namespace="ns",pod="p",pod_uid="u1",vgpu="0"}} 30
DCGM_FI_DEV_GPU_UTIL{{{DCGM_LABELS},namespace="ns",pod="q",pod_uid="u2",vgpu="1"}} 50
DCGM_FI_DEV_FB_FREE{{{DCGM_LABELS},namespace="ns",pod="p",vgpu="0"}} 10
DCGM_FI_DEV_GPU_UTIL{{gpu="1",UUID="GPU-2",Hostname="n1",namespace="ops",pod="exporter"}} 0
DCGM_FI_DEV_GPU_UTIL{{gpu="2",UUID="GPU-3",Hostname="n1",namespace="ns",pod="r"}} 60
"""
    assert_readings(
        read(page),
        [
            nvidia("ns", "p", "GPU-1", "n1", util=30, engine=None, memory=None),
            nvidia("ns", "q", "GPU-1", "n1", util=50, engine=None, memory=None),
            # Learnt on GPU-1, the exporter's pair is no pod on its idle GPU-2 either.
            nvidia("ns", "r", "GPU-3", "n1", util=60, engine=None, memory=None),
        ],
    )
    # Without pod_uid beside it, a series with a plain pair is a pod's: nothing is learnt.
    unlearnt = read(page.replace('pod_uid="u1",', "").replace('pod_uid="u2",', ""))
    assert sorted((r.pod, r.gpu) for r in unlearnt) == [
        ("exporter", "GPU-1"),
        ("exporter", "GPU-2"),
        ("p", "GPU-1"),
        ("q", "GPU-1"),
        ("r", "GPU-3"),
    ]


def spoofed_page(pod_labels: str) -> str:
    """A dcgm-exporter page with --kubernetes-enable-pod-labels: each series carries its pod's own
    Kubernetes labels (which the pod's owner writes), then the exporter's container/namespace/pod."""
    return f"""
DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-0",Hostname="n1",app="chat",container="c",namespace="team-b",pod="chat-0"}} 90
DCGM_FI_DEV_GPU_UTIL{{gpu="1",UUID="GPU-1",Hostname="n1",app="x",{pod_labels},container="c",namespace="team-a",pod="evil-0"}} 0
"""


# Pod labels of team-a's evil-0 that name team-b's chat-0 (or its namespace) in a pod-label pair.
SPOOFS = {
    "exported": 'exported_namespace="team-b",exported_pod="chat-0"',
    "ack-camel-case": 'NamespaceName="team-b",PodName="chat-0"',
    "old-namespace": 'pod_namespace="team-b",pod_name="chat-0"',
    "namespace-only": 'exported_namespace="team-b"',
}


@pytest.mark.parametrize("pod_labels", SPOOFS.values(), ids=SPOOFS.keys())
def test_a_pods_own_labels_naming_another_pod_count_its_gpu_for_neither(pod_labels: str) -> None:
    page = spoofed_page(pod_labels)
    if pod_labels == SPOOFS["namespace-only"]:
        page = page.replace('pod="evil-0"', 'pod="chat-0"')  # its own pod's name is its owner's to choose
    readings = read(page)
    assert [(r.namespace, r.pod, r.gpu, r.utilization) for r in readings] == [
        ("team-b", "chat-0", "GPU-0", 90)
    ]
    # The same series stored by Prometheus (honorLabels false: the exporter's own pair is renamed past
    # the pod's labels, to exported_exported_*): the same readings.
    stored = through_prometheus(parse_exposition(page, SAMPLE_NAMES), honor_labels=False)
    readings = readings_from_samples(stored, through_prometheus=True)
    assert [(r.namespace, r.pod, r.gpu, r.utilization) for r in readings] == [
        ("team-b", "chat-0", "GPU-0", 90)
    ]


def test_with_use_old_namespace_a_pods_namespace_and_pod_labels_name_no_other_pod() -> None:
    """--use-old-namespace: the exporter's pair is pod_namespace/pod_name, and a pod's own `namespace` and
    `pod` labels stay on its series as copied."""
    page = """
DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-0",Hostname="n1",pod_namespace="team-b",pod_name="chat-0"} 90
DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-1",Hostname="n1",namespace="team-b",pod="chat-0",pod_namespace="team-a",pod_name="evil-0"} 0
"""
    assert [(r.namespace, r.pod, r.gpu) for r in read(page)] == [("team-b", "chat-0", "GPU-0")]
    stored = through_prometheus(parse_exposition(page, SAMPLE_NAMES), honor_labels=False)
    readings = readings_from_samples(stored, through_prometheus=True)
    assert [(r.namespace, r.pod, r.gpu) for r in readings] == [("team-b", "chat-0", "GPU-0")]
