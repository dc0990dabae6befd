"""An LLM-serving fleet: vLLM-like pods batching requests continuously, behind the inference gateway.

Each pod admits waiting requests while it has a batch slot and KV-cache room for the request's prompt and
output; prefill of newly admitted prompts takes the pod's step time first, the rest decodes one token per
running request every ITL = α + β·batch seconds. While no pod is Ready the gateway holds requests, up to
its request TTL, then drops them. The constants and their sources are in docs/BENCHMARKS.md (LLM serving).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from operator import attrgetter


@dataclass(frozen=True)
class ServerModel:
    """One pod: Llama-3.1-8B-Instruct on one H100 80 GB under vLLM (sources in docs/BENCHMARKS.md)."""

    itl_alpha: float = 0.0072  # s: llm-d WVA fit, H100 α 6.96–7.47 ms
    itl_beta: float = 0.000043  # s per request in the batch: the same fit, β 0.042–0.044 ms
    prefill_tokens_per_second: float = 25_000.0  # an assumption: no trustworthy measured rate was found
    kv_capacity_tokens: int = 444_688  # 27,793 blocks × 16 at gpu_memory_utilization 0.9
    batch_limit: int = 1024  # vLLM's max_num_seqs on GPUs ≥ 70 GiB
    scheduling_seconds: float = 5.0  # an assumption: a node with the image is free
    model_load_seconds: float = 70.0  # 65–85 s to Ready with weights and compile caches on the node
    gateway_ttl: float = 60.0  # llm-d EPP noEndpointRequestTTL (follows defaultRequestTTL, 60 s)

    @property
    def cold_start(self) -> float:
        return self.scheduling_seconds + self.model_load_seconds

    def itl(self, batch: int) -> float:
        return self.itl_alpha + self.itl_beta * batch


class Request:
    """One request; `admitted` is when it got a batch slot (its wait ends there), None until then."""

    __slots__ = ("admitted", "arrived", "dropped", "finish_clock", "output", "prompt")

    def __init__(self, arrived: float, prompt: int, output: int) -> None:
        self.arrived = arrived
        self.prompt = prompt
        self.output = output
        self.admitted: float | None = None
        self.dropped = False
        self.finish_clock = 0.0


@dataclass
class Tally:
    """What happened to the requests so far (conservation: arrived = completed + dropped + in the system)."""

    arrived: int = 0
    completed: int = 0
    dropped: int = 0
    waits: list[float] = field(default_factory=list)  # per admitted or dropped request, seconds
    busy_decode_seconds: float = 0.0  # Σ over completed requests of admission → last token
    output_tokens: int = 0  # of completed requests


class Pod:
    """One inference server. `clock` counts the tokens each running request has decoded since the pod
    started: a request admitted at clock c with n output tokens finishes when the clock reaches c + n."""

    __slots__ = (
        "_serial",
        "busy",
        "clock",
        "created",
        "inflight",
        "kv_base",
        "kv_reserved",
        "model",
        "name",
        "prefill_owed",
        "queue",
        "ready_at",
        "running",
    )

    def __init__(self, name: str, created: float, ready_at: float, model: ServerModel) -> None:
        self.name = name
        self.created = created
        self.ready_at = ready_at
        self.model = model
        self.queue: deque[Request] = deque()
        self.running: list[tuple[float, int, Request]] = []  # heap by finish clock
        self.clock = 0.0
        self.kv_reserved = 0  # prompt + output of every running request: what admission checks
        self.kv_base = 0.0  # Σ (prompt − clock at admission): KV in use = kv_base + len(running) × clock
        self.prefill_owed = 0.0  # seconds of prefill admitted but not yet computed
        self.busy = 0.0  # seconds with work on the GPU (what GPU utilisation measures)
        self.inflight = 0  # running + waiting, the pod's `requests` value
        self._serial = 0

    def ready(self, now: float) -> bool:
        return self.ready_at <= now

    @property
    def waiting(self) -> int:
        return len(self.queue)

    @property
    def batch(self) -> int:
        return len(self.running)

    def kv_usage(self) -> float:
        """KV cache in use, 0–1: every running request's prompt and the tokens it has generated so far."""
        used = self.kv_base + len(self.running) * self.clock
        return min(1.0, max(0.0, used / self.model.kv_capacity_tokens))

    def enqueue(self, request: Request, now: float, tally: Tally) -> None:
        self.queue.append(request)
        self.inflight += 1
        if len(self.queue) == 1:
            self.admit(now, tally)

    def admit(self, now: float, tally: Tally) -> None:
        model = self.model
        while self.queue and len(self.running) < model.batch_limit:
            request = self.queue[0]
            need = request.prompt + request.output
            if self.kv_reserved + need > model.kv_capacity_tokens and self.running:
                break  # vLLM keeps it waiting until blocks free up (an empty pod takes it regardless)
            self.queue.popleft()
            request.admitted = now
            tally.waits.append(now - request.arrived)
            request.finish_clock = self.clock + request.output
            self.kv_reserved += need
            self.kv_base += request.prompt - self.clock
            self.prefill_owed += request.prompt / model.prefill_tokens_per_second
            self._serial += 1
            heapq.heappush(self.running, (request.finish_clock, self._serial, request))

    def advance(self, now: float, dt: float, tally: Tally) -> None:
        """Run the GPU for dt seconds ending at `now`: prefill first, then decode steps."""
        budget = dt
        if self.prefill_owed > 0:
            spent = min(budget, self.prefill_owed)
            self.prefill_owed -= spent
            budget -= spent
            self.busy += spent
        if self.running and budget > 0:
            self.clock += budget / self.model.itl(len(self.running))
            self.busy += budget
            while self.running and self.running[0][0] <= self.clock:
                _, _, request = heapq.heappop(self.running)
                self.kv_reserved -= request.prompt + request.output
                self.kv_base -= request.prompt - (request.finish_clock - request.output)
                self.inflight -= 1
                tally.completed += 1
                tally.output_tokens += request.output
                tally.busy_decode_seconds += now - (request.admitted or now)
            if not self.running:
                self.kv_base = 0.0  # no drift from float sums once the pod is empty
        if self.queue:
            self.admit(now, tally)
        self.inflight = len(self.running) + len(self.queue)


_LOAD = attrgetter("inflight")


class Fleet:
    """The target's pods (serving), pods removed but finishing their work (draining), and the gateway."""

    def __init__(self, model: ServerModel, replicas: int, now: float) -> None:
        self.model = model
        self.tally = Tally()
        self.pods: list[Pod] = []
        self.draining: list[Pod] = []
        self.gateway: deque[Request] = deque()
        self._serial = 0
        for _ in range(replicas):
            self._add(now, ready_at=now)  # the run starts from a warm fleet of this size
        self._ready: list[Pod] = list(self.pods)

    @property
    def replicas(self) -> int:
        return len(self.pods)

    def ready_pods(self) -> list[Pod]:
        return self._ready

    def gpus(self) -> int:
        """Pods holding a GPU now: serving (starting or ready) and draining."""
        return len(self.pods) + len(self.draining)

    def in_system(self) -> int:
        return len(self.gateway) + sum(p.inflight for p in self.pods) + sum(p.inflight for p in self.draining)

    def waiting(self) -> int:
        """Requests without a batch slot: held by the gateway or queued on a pod."""
        return len(self.gateway) + sum(p.waiting for p in self.pods) + sum(p.waiting for p in self.draining)

    def arrive(self, request: Request) -> None:
        self.tally.arrived += 1
        if self._ready:
            min(self._ready, key=_LOAD).enqueue(request, request.arrived, self.tally)
        else:
            self.gateway.append(request)

    def step(self, now: float, dt: float) -> None:
        """Advance every pod to `now`, then readiness, the gateway's TTL, and its release of held requests."""
        tally = self.tally
        for pod in self.pods:
            pod.advance(now, dt, tally)
        if self.draining:
            for pod in self.draining:
                pod.advance(now, dt, tally)
            self.draining = [p for p in self.draining if p.inflight or p.prefill_owed > 0]
        if len(self._ready) != len(self.pods):
            self._ready = [p for p in self.pods if p.ready(now)]
        gateway = self.gateway
        while gateway and gateway[0].arrived + self.model.gateway_ttl <= now:
            request = gateway.popleft()
            request.dropped = True
            tally.dropped += 1
            tally.waits.append(self.model.gateway_ttl)
        if gateway and self._ready:
            while gateway:
                min(self._ready, key=_LOAD).enqueue(gateway.popleft(), now, tally)

    def resize(self, target: int, now: float) -> bool:
        """Scale the Deployment to `target` pods; False when it already has that many."""
        if target == len(self.pods):
            return False
        while len(self.pods) < target:
            self._add(now, now + self.model.cold_start)
        if len(self.pods) > target:
            # A ReplicaSet removes pods that are not ready before ready ones, and newer before older.
            self.pods.sort(key=lambda p: (p.ready(now), -p.created), reverse=True)
            for pod in self.pods[target:]:
                if pod.ready(now) and (pod.inflight or pod.prefill_owed > 0):
                    self.draining.append(pod)  # leaves the pool; finishes what it holds, on its GPU
            del self.pods[target:]
        self._ready = [p for p in self.pods if p.ready(now)]
        return True

    def _add(self, now: float, ready_at: float) -> None:
        self.pods.append(Pod(f"vllm-{self._serial}", now, ready_at, self.model))
        self._serial += 1
