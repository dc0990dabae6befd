"""The demo fleet's GPUs: what each reads at a time (busy %, memory, power), and the exporter pages that print
it, dcgm-exporter's for NVIDIA nodes and AMD's device-metrics-exporter's for AMD nodes."""

from __future__ import annotations

import hashlib
import math

from keda_gpu_scaler.demo.layout import (
    AMD_FAMILIES,
    DCGM_FAMILIES,
    H100_RESERVED_MIB,
    H100_TOTAL_MIB,
    MI300X_IDLE_USED_MB,
    MI300X_TOTAL_MB,
    SERVING_IDLE_BELOW,
    Gpu,
    Node,
    amd_labels,
    dcgm_labels,
)
from keda_gpu_scaler.pages import pagetext


class Noise:
    """Smooth pseudo-random values, a function of the seed, a key and the time only."""

    def __init__(self, seed: int) -> None:
        self._seed = seed

    def __call__(self, key: str, t: float, step_s: float) -> float:
        """Smooth pseudo-random value in [-1, 1]: seeded knots every ``step_s`` seconds, eased between."""
        position = t / step_s
        knot = math.floor(position)
        frac = position - knot
        eased = frac * frac * (3 - 2 * frac)
        before, after = self._knot(key, knot), self._knot(key, knot + 1)
        return before + (after - before) * eased

    def _knot(self, key: str, knot: int) -> float:
        # A hash instead of a shared RNG: the value at a time must not depend on what was rendered before.
        digest = hashlib.blake2b(f"{self._seed}/{key}/{knot}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / (1 << 63) - 1.0


class GpuPages:
    """The GPUs' readings and exporter pages at a time `t` (seconds since the fleet started).

    `pins`: pod → its pinned busy %, the fleet's own dict (a pin set there shows on the next page).
    """

    def __init__(self, noise: Noise, pins: dict[str, float], namespace: str) -> None:
        self._noise = noise
        self._pins = pins
        self._namespace = namespace

    def render(self, node: Node, t: float) -> str:
        """The /metrics page the node's exporter prints at t, in its vendor's exporter format."""
        if node.vendor == "nvidia":
            return self._render_dcgm(node, t)
        return self._render_amd(node, t)

    def utilisation(self, gpu: Gpu, t: float) -> float:
        pod = gpu.pod
        if pod is None:
            return 0.0
        pinned = self._pins.get(pod.name)
        if pinned is not None:
            return pinned
        noise = self._noise(f"{pod.name}/{gpu.slot}/util", t, 4.0)
        if pod.training:
            # Training runs flat out, except while a checkpoint is written: the GPUs then wait on storage.
            in_cycle = (t + pod.phase) % pod.period_s
            if in_cycle >= pod.period_s - 30.0:
                return max(0.0, 1.0 + noise)
            return min(100.0, pod.peak + 4.0 * noise)
        wave = math.sin(2 * math.pi * t / pod.period_s + pod.phase)
        demand = (wave - SERVING_IDLE_BELOW) / (1 - SERVING_IDLE_BELOW)
        if demand <= 0:
            # An inference server with no request runs no kernel at all: exactly 0 %.
            return 0.0
        # GPU_UTIL is a duty cycle, so a trickle of requests already reads high: hence the power < 1.
        return min(100.0, max(0.0, pod.peak * math.pow(demand, 0.6) + 6.0 * noise))

    def memory_used_fraction(self, gpu: Gpu, t: float) -> float:
        pod = gpu.pod
        if pod is None:
            return 0.0
        noise = self._noise(f"{pod.name}/{gpu.slot}/memory", t, 7.0)
        if pod.training:
            # Activations and optimizer state come and go with the step; the weights stay.
            swing = 0.5 + 0.5 * math.sin(2 * math.pi * t / 75.0 + gpu.slot)
            return 0.72 + 0.16 * swing + 0.01 * noise
        # vLLM reserves --gpu-memory-utilization (0.9) of the GPU at start, whatever the traffic.
        return 0.9 + 0.0003 * noise

    def _power_w(self, gpu: Gpu, t: float, util: float, idle_w: float, per_percent_w: float) -> float:
        return idle_w + per_percent_w * util + 6.0 * self._noise(f"{gpu.identity}/power", t, 3.0)

    def _render_dcgm(self, node: Node, t: float) -> str:
        rows: list[tuple[str, dict[str, str]]] = []
        for gpu in node.gpus:
            util = self.utilisation(gpu, t)
            training = gpu.pod is not None and gpu.pod.training
            used = round(self.memory_used_fraction(gpu, t) * (H100_TOTAL_MIB - H100_RESERVED_MIB))
            # GPU_UTIL counts any kernel running; the engine is busy a little less of the time than that.
            gr_active = min(1.0, util / 100 * (0.93 + 0.03 * self._noise(f"{gpu.identity}/gr", t, 5.0)))
            # Decode is memory-bound: serving keeps the copy engines and DRAM busier than the tensor cores.
            tensor_share, dram_share, copy_share = (0.55, 0.4, 0.35) if training else (0.25, 0.6, 0.55)
            energy_j = gpu.energy_at_start_j + gpu.mean_power_w * t
            values = {
                "DCGM_FI_DEV_SM_CLOCK": str(1980 if util > 0 else 345),
                "DCGM_FI_DEV_MEM_CLOCK": "2619",
                "DCGM_FI_DEV_MEMORY_TEMP": str(round(34 + 0.3 * util)),
                "DCGM_FI_DEV_GPU_TEMP": str(round(31 + 0.38 * util + self._noise(gpu.identity, t, 9.0))),
                "DCGM_FI_DEV_POWER_USAGE": f"{self._power_w(gpu, t, util, 72.0, 6.2):.6f}",
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": str(int(energy_j * 1000)),
                "DCGM_FI_DEV_GPU_UTIL": str(round(util)),
                "DCGM_FI_DEV_MEM_COPY_UTIL": str(round(util * copy_share)),
                "DCGM_FI_DEV_XID_ERRORS": "0",
                "DCGM_FI_DEV_FB_FREE": str(H100_TOTAL_MIB - H100_RESERVED_MIB - used),
                "DCGM_FI_DEV_FB_USED": str(used),
                "DCGM_FI_DEV_FB_RESERVED": str(H100_RESERVED_MIB),
                "DCGM_FI_PROF_GR_ENGINE_ACTIVE": f"{gr_active:.6f}",
                "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": f"{gr_active * tensor_share:.6f}",
                "DCGM_FI_PROF_DRAM_ACTIVE": f"{gr_active * dram_share:.6f}",
            }
            rows.append((pagetext.label_text(dcgm_labels(node.name, gpu, self._namespace)), values))
        return pagetext.render(
            (name, kind, help_text, [(labels, values[name]) for labels, values in rows])
            for name, kind, help_text in DCGM_FAMILIES
        )

    def _render_amd(self, node: Node, t: float) -> str:
        rows: list[tuple[tuple[str, ...], str, dict[str, float]]] = []
        for gpu in node.gpus:
            util = self.utilisation(gpu, t)
            fraction = self.memory_used_fraction(gpu, t)
            used = round(fraction * MI300X_TOTAL_MB) if gpu.pod is not None else MI300X_IDLE_USED_MB
            values = {
                "gpu_energy_consumed": float(int((gpu.energy_at_start_j + gpu.mean_power_w * t) * 1e6)),
                "gpu_free_vram": float(MI300X_TOTAL_MB - used),
                "gpu_gfx_activity": float(round(util)),
                "gpu_junction_temperature": float(
                    round(41 + 0.45 * util + self._noise(gpu.identity, t, 9.0))
                ),
                "gpu_package_power": float(round(self._power_w(gpu, t, util, 142.0, 5.9))),
                "gpu_total_vram": float(MI300X_TOTAL_MB),
                "gpu_umc_activity": float(round(util * 0.5)),
                "gpu_used_vram": float(used),
            }
            labels = sorted(amd_labels(node.name, gpu, self._namespace).items())
            rows.append((tuple(value for _, value in labels), pagetext.label_text(labels), values))
        # client_golang orders the series of a family by their label values: idle GPUs (container="") first.
        rows.sort(key=lambda row: row[0])
        return pagetext.render(
            (
                name,
                "gauge",
                help_text,
                [(labels, pagetext.go_float(values[name])) for _, labels, values in rows],
            )
            for name, help_text in AMD_FAMILIES
        )
