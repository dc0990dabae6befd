"""The demo fleet's make-up: its nodes, GPUs, pods and inference servers, the exporters' families and
labels, and the traffic each workload sees (all a function of the seed)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

# What the real exporters answer with; scrapers look at the media type, not only at the body.
EXPOSITION_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_H100_MODEL = "NVIDIA H100 80GB HBM3"
_NVIDIA_DRIVER = "550.144.03"
# nvidia-smi's "Total" for an H100 80GB HBM3; used + free + reserved add up to it.
H100_TOTAL_MIB = 81559
H100_RESERVED_MIB = 480
# PCI addresses of the GPUs on an HGX H100 baseboard, in nvidia-smi order.
_HGX_BUS_IDS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")

_MI300X_CARD_MODEL = "102-G30211-0C"
MI300X_TOTAL_MB = 196592
# VRAM the driver and firmware hold on an MI300X with nothing running.
MI300X_IDLE_USED_MB = 283

# Characters Kubernetes uses for generated name suffixes (no vowels, no look-alikes).
_K8S_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"

# A serving pod is idle (exactly 0 %) while its traffic wave is below this level: with
# -0.2 a bit less than half of each period is idle, so activity flips every minute or so.
SERVING_IDLE_BELOW = -0.2

# Inference pods: a workload's requests are zero (night, nobody asking) while its daily wave is below this.
REQUESTS_IDLE_BELOW = -0.25
# The largest running/waiting count the load control accepts for one pod.
MAX_PINNED_REQUESTS = 10_000

# What /load takes, and what the control server's / says about it.
INFERENCE_LOAD_PARAMETERS = ("running", "waiting", "kv_cache")
_GATEWAY_LOAD_PARAMETERS = ("pool", "pending")
LOAD_PARAMETERS = ("pod", "value", *INFERENCE_LOAD_PARAMETERS, *_GATEWAY_LOAD_PARAMETERS)
LOAD_USAGE = (
    "GPU pods: GET /load?pod=NAME&value=PERCENT pins a pod's GPU utilisation (0-100). Inference pods:"
    " GET /load?pod=NAME&running=N&waiting=N pins its requests running and waiting (the one left out is 0),"
    " value=N pins N requests in flight (split as the server would), kv_cache=PERCENT pins its KV-cache"
    " too. value=auto returns a pod to the moving pattern. The gateway: GET /load?pool=NAME&pending=N"
    " queues N requests at the pool's endpoint picker (its model server is at zero replicas)"
)

# (name, TYPE, HELP) in the order of dcgm-exporter's etc/default-counters.csv.
DCGM_FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB)."),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
    ),
)

# (name, HELP) as device-metrics-exporter registers them; client_golang prints families sorted by name.
AMD_FAMILIES: tuple[tuple[str, str], ...] = (
    ("gpu_energy_consumed", "Accumulated energy consumed by the GPU in uJ"),
    ("gpu_free_vram", "Free VRAM memory of the GPU (in MB)"),
    ("gpu_gfx_activity", "Graphics engine usage in Percentage (0-100)"),
    ("gpu_junction_temperature", "Current junction/hotspot temperature in Celsius"),
    ("gpu_package_power", "Current socket power in Watts"),
    ("gpu_total_vram", "Total VRAM memory of the GPU (in MB)"),
    ("gpu_umc_activity", "Memory engine usage in Percentage (0-100)"),
    ("gpu_used_vram", "Used VRAM memory of the GPU (in MB)"),
)


@dataclass(frozen=True)
class DemoWorkload:
    """One scale target of the demo: its pods are named f"{name}-<suffix>" in namespace ``demo``."""

    name: str
    vendor: str
    gpus_per_pod: int
    pods: tuple[str, ...]


@dataclass(frozen=True)
class DemoInferenceWorkload:
    """One scale target served by an LLM inference server; each pod's page is at the fleet's own URL.

    ``engines_per_pod`` gives, pod by pod, the data-parallel engines (vLLM ``engine``, SGLang ``dp_rank``).
    """

    name: str
    engine: str
    model: str
    pods: tuple[str, ...]
    engines_per_pod: tuple[int, ...]


@dataclass(frozen=True)
class _Traffic:
    """A workload's requests in flight over time: a compressed day plus bursts, summed over its pods."""

    period_s: float
    phase: float
    # Requests in flight over all pods at the top of the day, and what a burst adds on top.
    peak: float
    burst_extra: float
    burst_every_s: float
    burst_first_s: float


@dataclass(frozen=True)
class InferencePod:
    name: str
    workload: str
    engine: str  # "vllm" or "sglang": which page it prints
    model: str
    engines: int  # data-parallel engines
    tp_size: int  # SGLang: tensor-parallel ranks repeating each engine's values
    share: float  # the pod's share of the workload's requests (a DP pod takes more)
    max_running: int  # per engine: vLLM --max-num-seqs, SGLang --max-running-requests
    kv_per_request: float  # KV-cache fraction one running request holds
    starts_after_s: float  # vLLM prints its families only once its engine is up (weights loaded)
    traffic: _Traffic


@dataclass(frozen=True)
class RequestPin:
    running: int
    waiting: int
    kv_cache_percent: float | None


@dataclass(frozen=True)
class Pod:
    name: str
    workload: str
    container: str
    node: str
    gpus: tuple[int, ...]
    training: bool
    period_s: float
    # Serving: phase of the traffic wave in radians. Training: seconds into the checkpoint cycle at t=0.
    phase: float
    peak: float


@dataclass(frozen=True)
class Gpu:
    index: int
    # NVIDIA: the GPU UUID; AMD: the board serial number. Both identify the device on the page.
    identity: str
    pci_bus_id: str
    pod: Pod | None
    # Position of this GPU among its pod's GPUs, so the GPUs of one pod get their own noise.
    slot: int
    # Energy counter at t=0 (J) and the mean draw used to advance it, so it only ever grows.
    energy_at_start_j: float
    mean_power_w: float


@dataclass(frozen=True)
class Node:
    name: str
    vendor: str
    gpus: tuple[Gpu, ...]


def dcgm_labels(node: str, gpu: Gpu, namespace: str) -> list[tuple[str, str]]:
    labels = [
        ("gpu", str(gpu.index)),
        ("UUID", gpu.identity),
        ("pci_bus_id", gpu.pci_bus_id),
        ("device", f"nvidia{gpu.index}"),
        ("modelName", _H100_MODEL),
        ("Hostname", node),
        ("DCGM_FI_DRIVER_VERSION", _NVIDIA_DRIVER),
    ]
    # dcgm-exporter leaves the pod labels out entirely on a GPU no pod holds.
    if gpu.pod is not None:
        labels += [("container", gpu.pod.container), ("namespace", namespace), ("pod", gpu.pod.name)]
    return labels


def amd_labels(node: str, gpu: Gpu, namespace: str) -> dict[str, str]:
    pod = gpu.pod
    # The mandatory labels are always printed, empty when no pod holds the GPU.
    return {
        "card_model": _MI300X_CARD_MODEL,
        "container": pod.container if pod else "",
        "deployment_mode": "baremetal",
        "gpu_compute_partition_type": "spx",
        "gpu_id": str(gpu.index),
        "gpu_memory_partition_type": "nps1",
        "gpu_partition_id": "0",
        "hostname": node,
        "job_id": "",
        "job_partition": "",
        "job_user": "",
        "namespace": namespace if pod else "",
        "pod": pod.name if pod else "",
        "serial_number": gpu.identity,
    }


def _k8s_suffix(rng: random.Random, length: int) -> str:
    return "".join(rng.choice(_K8S_NAME_ALPHABET) for _ in range(length))


def _nvidia_uuid(rng: random.Random) -> str:
    hex_digits = f"{rng.getrandbits(128):032x}"
    return "GPU-" + "-".join(
        (hex_digits[:8], hex_digits[8:12], hex_digits[12:16], hex_digits[16:20], hex_digits[20:])
    )


def build_layout(rng: random.Random) -> tuple[dict[str, Node], list[Pod]]:
    """The fleet: two H100 nodes (vllm-qwen across both, trainer on b, one idle GPU on a), one MI300X node."""
    pods: list[Pod] = []

    def serving(workload: str, pod: str, node: str, gpu: int, period_s: float, phase: float) -> None:
        # Replicas behind one Service see the same traffic, give or take load-balancing luck.
        jitter = rng.uniform(-0.25, 0.25)
        pods.append(
            Pod(
                name=pod,
                workload=workload,
                container="vllm",
                node=node,
                gpus=(gpu,),
                training=False,
                period_s=period_s,
                phase=phase + jitter,
                peak=rng.uniform(85.0, 97.0),
            )
        )

    # vllm-qwen, a Deployment: busy and rising at start, idle about a minute of every 2.5 minutes.
    template_hash = _k8s_suffix(rng, 10)
    for node, gpu in (("gpu-node-a", 0), ("gpu-node-b", 0), ("gpu-node-b", 1)):
        pod = f"vllm-qwen-{template_hash}-{_k8s_suffix(rng, 5)}"
        serving("vllm-qwen", pod, node, gpu, period_s=150.0, phase=0.35)
    # trainer, a StatefulSet of one 4-GPU pod: flat out, first checkpoint pause 90 s after start.
    pods.append(
        Pod(
            name="trainer-0",
            workload="trainer",
            container="pytorch",
            node="gpu-node-b",
            gpus=(2, 3, 4, 5),
            training=True,
            period_s=240.0,
            phase=120.0,
            peak=rng.uniform(92.0, 97.0),
        )
    )
    # vllm-llama, a StatefulSet: idle at start (so a newcomer sees activation happen), busy after ~45 s.
    llama_phase = math.asin(SERVING_IDLE_BELOW) - 2 * math.pi * 45.0 / 180.0
    for index in range(2):
        serving(
            "vllm-llama", f"vllm-llama-{index}", "mi300x-node-1", index, period_s=180.0, phase=llama_phase
        )

    nodes: dict[str, Node] = {}
    for name, vendor, count in (
        ("gpu-node-a", "nvidia", 2),
        ("gpu-node-b", "nvidia", 6),
        ("mi300x-node-1", "amd", 8),
    ):
        gpus = []
        for index in range(count):
            owner = next((pod for pod in pods if pod.node == name and index in pod.gpus), None)
            if vendor == "nvidia":
                identity, bus = _nvidia_uuid(rng), f"00000000:{_HGX_BUS_IDS[index]}:00.0"
                mean_power_w = 450.0 if owner else 72.0
            else:
                identity, bus = str(rng.randrange(692409000000, 692410000000)), ""
                mean_power_w = 520.0 if owner else 142.0
            uptime_s = rng.uniform(3, 20) * 86400
            gpus.append(
                Gpu(
                    index=index,
                    identity=identity,
                    pci_bus_id=bus,
                    pod=owner,
                    slot=owner.gpus.index(index) if owner else 0,
                    energy_at_start_j=uptime_s * mean_power_w,
                    mean_power_w=mean_power_w,
                )
            )
        nodes[name] = Node(name, vendor, tuple(gpus))
    return nodes, pods


def workloads_of(pods: list[Pod], nodes: dict[str, Node]) -> tuple[DemoWorkload, ...]:
    names = list(dict.fromkeys(pod.workload for pod in pods))
    result = []
    for name in names:
        members = [pod for pod in pods if pod.workload == name]
        vendor = nodes[members[0].node].vendor
        result.append(DemoWorkload(name, vendor, len(members[0].gpus), tuple(pod.name for pod in members)))
    return tuple(result)


def burst(t: float, traffic: _Traffic) -> float:
    """0-1: a burst of traffic (a launch, a batch job) every ``burst_every_s``: up in 6 s, held, gone in 15 s."""
    if t < traffic.burst_first_s:
        return 0.0
    into = (t - traffic.burst_first_s) % traffic.burst_every_s
    if into < 6.0:
        return into / 6.0
    if into < 30.0:
        return 1.0
    if into < 45.0:
        return (45.0 - into) / 15.0
    return 0.0


def build_inference_layout(rng: random.Random, engine_start_s: float) -> list[InferencePod]:
    """vllm-chat: three vLLM pods, the first data-parallel with 2 engines; sglang-code: two SGLang pods."""
    pods: list[InferencePod] = []
    # vllm-chat, a StatefulSet: busy and rising at start, a burst at ~50 s and then every 3 minutes,
    # nobody asking for about a minute of every 4 (its "night"). Total at the top of the day ~64 in
    # flight, ~160 in a burst: with 16 per pod, 4 and 10 replicas.
    chat = _Traffic(
        period_s=240.0, phase=0.35, peak=64.0, burst_extra=96.0, burst_every_s=180.0, burst_first_s=50.0
    )
    for index, (engines, share) in enumerate(((2, 0.5), (1, 0.25), (1, 0.25))):
        pods.append(
            InferencePod(
                name=f"vllm-chat-{index}",
                workload="vllm-chat",
                engine="vllm",
                model="meta-llama/Llama-3.1-8B-Instruct",
                engines=engines,
                tp_size=1,
                share=share * rng.uniform(0.95, 1.05),
                max_running=24,
                kv_per_request=0.03,
                # The last replica is still loading its weights when the demo starts.
                starts_after_s=engine_start_s if index == 2 else 0.0,
                traffic=chat,
            )
        )
    # sglang-code, a StatefulSet of two tensor-parallel (tp 2) pods: idle at start, busy after ~30 s.
    code = _Traffic(
        period_s=200.0,
        phase=math.asin(REQUESTS_IDLE_BELOW) - 2 * math.pi * 30.0 / 200.0,
        peak=48.0,
        burst_extra=40.0,
        burst_every_s=150.0,
        burst_first_s=110.0,
    )
    for index in range(2):
        pods.append(
            InferencePod(
                name=f"sglang-code-{index}",
                workload="sglang-code",
                engine="sglang",
                model="Qwen/Qwen2.5-Coder-32B-Instruct",
                engines=1,
                tp_size=2,
                share=0.5 * rng.uniform(0.95, 1.05),
                max_running=32,
                kv_per_request=0.02,
                starts_after_s=0.0,
                traffic=code,
            )
        )
    return pods


def inference_workloads_of(pods: list[InferencePod]) -> tuple[DemoInferenceWorkload, ...]:
    result = []
    for name in dict.fromkeys(pod.workload for pod in pods):
        members = [pod for pod in pods if pod.workload == name]
        result.append(
            DemoInferenceWorkload(
                name,
                members[0].engine,
                members[0].model,
                tuple(pod.name for pod in members),
                tuple(pod.engines for pod in members),
            )
        )
    return tuple(result)
