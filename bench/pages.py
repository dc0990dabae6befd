"""Realistic exporter pages for benchmarks and tests: an NVIDIA dcgm-exporter page and an AMD one."""

from __future__ import annotations

import random
from collections.abc import Sequence

from keda_gpu_scaler.pages.pagetext import go_float

# dcgm-exporter's default counters (etc/default-counters.csv, plus the DCP fields and FB_RESERVED that
# recent releases enable): name, Prometheus type, help, and whether DCGM reports it as a double.
_DCGM_FAMILIES: list[tuple[str, str, str, bool]] = [
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", False),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", False),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", False),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", False),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", True),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        False,
    ),
    (
        "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
        "counter",
        "Total number of bytes transmitted through PCIe TX (in KB) via NVML.",
        False,
    ),
    (
        "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
        "counter",
        "Total number of bytes received through PCIe RX (in KB) via NVML.",
        False,
    ),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", False),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", False),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", False),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", False),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", False),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", False),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", False),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", False),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", False),
    (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "Total number of NVLink bandwidth counters for all lanes",
        False,
    ),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status", False),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
        False,
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for correctable errors",
        False,
    ),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed", False),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active.", True),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active.", True),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        True,
    ),
    ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "gauge", "Ratio of cycles the fp64 pipes are active.", True),
    ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "gauge", "Ratio of cycles the fp32 pipes are active.", True),
    ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "gauge", "Ratio of cycles the fp16 pipes are active.", True),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data"
        " payloads - in bytes per second.",
        False,
    ),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "The rate of data received over the PCIe bus - including both protocol headers and data"
        " payloads - in bytes per second.",
        False,
    ),
]

# Plausible ranges for the integer fields whose size differs from a 0-100 percentage.
_DCGM_INT_RANGES = {
    "DCGM_FI_DEV_SM_CLOCK": (345, 1980),
    "DCGM_FI_DEV_MEM_CLOCK": (2619, 2619),
    "DCGM_FI_DEV_MEMORY_TEMP": (30, 85),
    "DCGM_FI_DEV_GPU_TEMP": (28, 80),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": (10**9, 10**11),
    "DCGM_FI_DEV_FB_USED": (70000, 76000),
    "DCGM_FI_DEV_FB_FREE": (4000, 81000),
    "DCGM_FI_DEV_FB_RESERVED": (591, 591),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": (10**6, 10**12),
    "DCGM_FI_PROF_PCIE_TX_BYTES": (10**5, 10**9),
    "DCGM_FI_PROF_PCIE_RX_BYTES": (10**5, 10**9),
}

# The families a scaling trigger reads from each page.
DCGM_TRIGGER_FAMILIES = frozenset(
    {
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_RESERVED",
    }
)
AMD_TRIGGER_FAMILIES = frozenset({"gpu_gfx_activity", "gpu_used_vram", "gpu_free_vram", "gpu_total_vram"})

# Which pod runs on which GPU: a 4-GPU tensor-parallel server, two single-GPU pods, the rest idle.
_PODS = [
    ("vllm", "llm", "vllm-llama-70b-6c9f7d8b4-q8w2n"),
    ("vllm", "llm", "vllm-llama-70b-6c9f7d8b4-q8w2n"),
    ("vllm", "llm", "vllm-llama-70b-6c9f7d8b4-q8w2n"),
    ("vllm", "llm", "vllm-llama-70b-6c9f7d8b4-q8w2n"),
    ("tei", "embed", "text-embeddings-7f8d9c6b5-m2x7k"),
    ("triton", "vision", "triton-resnet-0"),
]


def dcgm_page(
    gpus: int = 8,
    seed: int = 1,
    *,
    pods: Sequence[tuple[str, str, str]] = _PODS,
    hostname: str = "gpu-node-a",
    values_seed: int | None = None,
) -> str:
    """A dcgm-exporter page for `gpus` H100s on one node, formatted as dcgm-exporter writes it.

    pods: (container, namespace, pod) of the first GPUs, one each; values_seed: draw the values apart from
    the GPUs' identities, so that pages of one node differing only in it print the same series."""
    rng = random.Random(seed)
    label_sets = []
    for gpu in range(gpus):
        uuid = "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}".format(
            *(rng.getrandbits(b) for b in (32, 16, 16, 16, 48))
        )
        labels = (
            f'gpu="{gpu}",UUID="{uuid}",pci_bus_id="00000000:{0x18 + 0x10 * gpu:02X}:00.0",'
            f'device="nvidia{gpu}",modelName="NVIDIA H100 80GB HBM3",Hostname="{hostname}",'
            'DCGM_FI_DRIVER_VERSION="550.144.03"'
        )
        if gpu < len(pods):
            container, namespace, pod = pods[gpu]
            labels += f',container="{container}",namespace="{namespace}",pod="{pod}"'
        label_sets.append(labels)
    if values_seed is not None:
        rng = random.Random(values_seed)

    lines = []
    for name, kind, help_text, is_double in _DCGM_FAMILIES:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for gpu, labels in enumerate(label_sets):
            busy = gpu < len(pods)
            if name == "DCGM_FI_DEV_XID_ERRORS":
                labels += ',err_code="0",err_msg="No Error"'
            if is_double:
                value = f"{rng.uniform(0.2, 0.95) if busy else 0.0:f}"
                if name == "DCGM_FI_DEV_POWER_USAGE":
                    value = f"{rng.uniform(350, 690) if busy else rng.uniform(68, 75):f}"
            elif name in _DCGM_INT_RANGES:
                low, high = _DCGM_INT_RANGES[name]
                value = str(rng.randint(low, high) if busy or name != "DCGM_FI_DEV_FB_USED" else 0)
            else:
                value = str(rng.randint(0, 100) if busy else 0)
            lines.append(f"{name}{{{labels}}} {value}")
    return "\n".join(lines) + "\n"


# The blocks the exporter counts ECC errors in, each with a correctable and an uncorrectable family.
_AMD_ECC_BLOCKS: tuple[str, ...] = (
    "sdma",
    "gfx",
    "mmhub",
    "athub",
    "bif",
    "hdp",
    "xgmi_wafl",
    "df",
    "smn",
    "sem",
)
_AMD_ECC_BLOCKS += ("mp0", "mp1", "fuse", "umc", "mca", "vcn", "jpeg", "ih", "mpio")
# AMD device-metrics-exporter families (no prefix: the exporter's own default), name and help.
_AMD_FAMILIES: list[tuple[str, str]] = [
    ("gpu_junction_temperature", "Current junction/hotspot temperature in Celsius"),
    ("gpu_memory_temperature", "Current memory temperature in Celsius"),
    ("gpu_package_power", "Current socket power in Watts"),
    ("gpu_power_usage", "GPU power usage in Watts"),
    ("gpu_energy_consumed", "Accumulated energy consumed by the GPU in uJ"),
    ("gpu_gfx_activity", "Graphics engine usage in Percentage (0-100)"),
    ("gpu_umc_activity", "Memory engine usage in Percentage (0-100)"),
    ("pcie_speed", "Current PCIe speed in GT/s"),
    ("pcie_max_speed", "Maximum PCIe speed in GT/s"),
    ("pcie_bandwidth", "Current instantaneous bandwidth usage in Mb/s"),
    ("pcie_replay_count", "Total number of PCIe replays (NAKs)"),
    ("pcie_recovery_count", "Total number of PCIe recoveries"),
    ("pcie_replay_rollover_count", "PCIe replay accumulated count"),
    ("pcie_nack_sent_count", "PCIe NACK sent accumulated count"),
    ("pcie_nack_received_count", "PCIe NACK received accumulated count"),
    ("gpu_clock", "Clock measure of the GPU in Mhz"),
    ("gpu_total_vram", "Total VRAM memory of the GPU (in MB)"),
    ("gpu_used_vram", "Used VRAM memory of the GPU (in MB)"),
    ("gpu_free_vram", "Free VRAM memory of the GPU (in MB)"),
    ("gpu_total_visible_vram", "Total visible VRAM memory of the GPU (in MB)"),
    ("gpu_used_visible_vram", "Used visible VRAM memory of the GPU (in MB)"),
    ("gpu_free_visible_vram", "Free visible VRAM memory of the GPU (in MB)"),
    ("gpu_total_gtt", "Total GTT memory of the GPU (in MB)"),
    ("gpu_used_gtt", "Used GTT memory of the GPU (in MB)"),
    ("gpu_free_gtt", "Free GTT memory of the GPU (in MB)"),
    ("gpu_ecc_correct_total", "Total correctable ECC error count"),
    ("gpu_ecc_uncorrect_total", "Total uncorrectable ECC error count"),
    *(
        (f"gpu_ecc_{kind}_{block}", f"{kind.capitalize()}able ECC error count in {block.upper()}")
        for block in _AMD_ECC_BLOCKS
        for kind in ("correct", "uncorrect")
    ),
    ("gpu_violation_ppt_residency_accumulated", "PPT residency accumulated"),
    ("gpu_violation_socket_thermal_residency_accumulated", "Socket thermal residency accumulated"),
    ("gpu_violation_hbm_thermal_residency_accumulated", "HBM thermal residency accumulated"),
]
_AMD_CLOCKS = [("0", "GPU_CLOCK_TYPE_SYSTEM"), ("0", "GPU_CLOCK_TYPE_MEMORY"), ("0", "GPU_CLOCK_TYPE_DATA")]
_AMD_MB = 196592


def amd_page(gpus: int = 8, seed: int = 1) -> str:
    """A device-metrics-exporter page for `gpus` MI300Xs: sorted labels, empty ones printed, Go floats."""
    rng = random.Random(seed)
    pods = ["vllm-llama-0"] * 4 + ["sglang-qwen-0", "sglang-qwen-1"]
    label_sets = []
    for gpu in range(gpus):
        pod = pods[gpu] if gpu < len(pods) else ""
        labels = {
            "card_model": "102-G30211-0C",
            "container": ("vllm" if pod.startswith("vllm") else "sglang") if pod else "",
            "deployment_mode": "baremetal",
            "gpu_compute_partition_type": "spx",
            "gpu_id": str(gpu),
            "gpu_memory_partition_type": "nps1",
            "gpu_partition_id": "0",
            "hostname": "mi300x-node-1",
            "job_id": "",
            "job_partition": "",
            "job_user": "",
            "namespace": "llm" if pod else "",
            "pod": pod,
            "serial_number": f"69240900{5408 + gpu}",
        }
        label_sets.append(labels)

    def render(name: str, labels: dict[str, str], value: float) -> str:
        body = ",".join(f'{key}="{labels[key]}"' for key in sorted(labels))
        return f"{name}{{{body}}} {go_float(value)}"

    lines = []
    for name, help_text in _AMD_FAMILIES:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} gauge")
        for labels in label_sets:
            busy = bool(labels["pod"])
            if name == "gpu_clock":
                for index, clock_type in _AMD_CLOCKS:
                    clock = {**labels, "clock_index": index, "clock_type": clock_type}
                    lines.append(render(name, clock, rng.choice([132, 900, 1300, 2100])))
                continue
            if name == "gpu_total_vram":
                value: float = _AMD_MB
            elif name == "gpu_used_vram":
                value = rng.randint(170000, 180000) if busy else 283
            elif name == "gpu_free_vram":
                value = _AMD_MB - rng.randint(170000, 180000) if busy else _AMD_MB - 283
            elif name == "gpu_energy_consumed":
                value = rng.uniform(1e9, 9e9)
            elif name in ("gpu_package_power", "gpu_power_usage"):
                value = rng.uniform(400, 750) if busy else rng.uniform(120, 140)
            elif name.endswith("activity"):
                value = rng.randint(20, 100) if busy else 0
            else:
                value = rng.randint(0, 80)
            lines.append(render(name, labels, value))
    return "\n".join(lines) + "\n"
