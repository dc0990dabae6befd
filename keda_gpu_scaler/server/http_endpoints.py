"""The HTTP endpoints beside the gRPC service: /metrics, /healthz, /readyz and /explain."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import math
from collections.abc import Iterable
from typing import Any, Protocol

from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from keda_gpu_scaler.core.latency import MIN_BUDGET_REQUESTS
from keda_gpu_scaler.core.pending import SATURATION, TURNED_AWAY
from keda_gpu_scaler.core.scaling import Evaluation, PodValue
from keda_gpu_scaler.core.trigger import KEYS, TriggerSpec
from keda_gpu_scaler.server.admission import Admission, explain_cost
from keda_gpu_scaler.server.registry import Explanation
from keda_gpu_scaler.telemetry import Telemetry

# How long an HTTP connection may stay without a complete request (header read timeout and idle limit).
# Prometheus reconnects for each scrape after this; 10 s is far above any honest client's header time.
HTTP_IDLE_SECONDS = 10.0


def _spec_json(spec: TriggerSpec) -> dict[str, Any]:
    """The trigger as its metadata keys name it (camelCase, like the ScaledObject)."""
    keys = {k.field: k.key for k in KEYS}
    return {keys.get(f.name, f.name): getattr(spec, f.name) for f in dataclasses.fields(spec)}


def explanation_json(namespace: str, name: str, explanation: Explanation) -> dict[str, Any]:
    """What /explain and the explain command show for one ScaledObject's last evaluation."""
    spec = explanation.spec
    entry: dict[str, Any] = {
        "namespace": namespace,
        "scaledObject": name,
        "evaluatedAt": datetime.datetime.fromtimestamp(explanation.evaluated_at, datetime.UTC).isoformat(
            timespec="milliseconds"
        ),
        "trigger": _spec_json(spec),
    }
    if explanation.evaluation is not None:
        entry.update(evaluation_json(explanation.evaluation, spec))
    else:
        entry["error"] = explanation.error
    if explanation.notes:
        entry["notes"] = list(explanation.notes)
    if explanation.discovery is not None:
        entry["discovery"] = explanation.discovery
    if explanation.slo is not None:
        entry["slo"] = _camel(explanation.slo)
        if explanation.slo.headroom is None:
            entry["slo"]["headroom"] = "not measured: fewer than two recent demand sums, or none above 0"
        if explanation.slo.budget_used is None:
            entry["slo"]["budgetUsed"] = (
                f"not measured: fewer than {MIN_BUDGET_REQUESTS:.0f} requests read in the last half hour"
                " (the headroom and the latency guard act in full)"
            )
    if explanation.learned is not None:
        entry["learnedTarget"] = _camel(explanation.learned)
    return entry


def _camel(record: Any) -> dict[str, Any]:
    """A dataclass (and those it holds) as JSON keys the way the rest of /explain names them."""

    def camel_dict(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        return {name.split("_")[0] + "".join(w.title() for w in name.split("_")[1:]): v for name, v in pairs}

    return dataclasses.asdict(record, dict_factory=camel_dict)


def _pod_json(pod: PodValue) -> dict[str, Any]:
    entry: dict[str, Any] = {"pod": pod.pod, "family": str(pod.family), "value": pod.value}
    if pod.inputs:
        entry["inputs"] = dict(pod.inputs)  # an inference server's waiting, running and KV-cache %
    else:
        entry["gpus"] = [{"gpu": g.gpu, "host": g.host, "value": g.value} for g in pod.gpus]
    return entry


def evaluation_json(evaluation: Evaluation, spec: TriggerSpec) -> dict[str, Any]:
    if spec.metric.gateway:
        return _pending_json(evaluation, spec)
    unknown = evaluation.value_unknown
    return {
        # As GetMetrics and IsActive answer: no value, no activity (UNAVAILABLE: valueUnknown and
        # activityUnknown say why) where it cannot be told.
        "value": None if unknown is not None else evaluation.value,
        "valueUnknown": unknown,
        "active": None if evaluation.activity_unknown is not None else evaluation.active,
        "activationThreshold": spec.activation_threshold,
        "threshold": spec.threshold,
        "aggregation": evaluation.aggregation.value,
        "pods": [_pod_json(p) for p in evaluation.pods],
        "missingPods": list(evaluation.missing_pods),
        "startingPods": list(evaluation.starting_pods),
        "missingPodValue": evaluation.missing_pod_value,
        "rule": evaluation.rule,
        "activityUnknown": evaluation.activity_unknown,
        "hpa": None if unknown is not None else _hpa_json(evaluation),
    }


def _hpa_json(evaluation: Evaluation) -> dict[str, Any]:
    """The replica counts the HPA would compute from the value, for either metricType."""
    return {
        "currentReplicas": evaluation.what_if.current_replicas,
        "readyReplicas": evaluation.what_if.ready_replicas,
        "desiredReplicasAverageValue": evaluation.what_if.average_value,
        "desiredReplicasValue": evaluation.what_if.value,
    }


def _replica_json(replica: PodValue) -> dict[str, Any]:
    """One fresh endpoint-picker replica: its queue by model, and its flow-control signals where shown
    (the row's GPU slots carry them: see pending.py)."""
    found: dict[str, Any] = {"replica": replica.pod, "fresh": True, "pending": replica.value}
    found["queueByModel"] = dict(replica.inputs)
    turned_away = sum(s.value for s in replica.gpus if s.gpu == TURNED_AWAY)
    if turned_away:
        found["turnedAwaySincePreviousPage"] = turned_away
    saturation = {s.host or "(no stage)": s.value for s in replica.gpus if s.gpu == SATURATION}
    if saturation:
        found["saturationNotLoad"] = saturation
    return found


def _pending_json(evaluation: Evaluation, spec: TriggerSpec) -> dict[str, Any]:
    """metric=pending: per endpoint-picker replica, whether its page was fresh and its queue by model."""
    replicas: list[dict[str, Any]] = [_replica_json(p) for p in evaluation.pods]
    replicas += [{"replica": name, "fresh": False} for name in evaluation.missing_pods]
    return {
        # As GetMetrics answers: no value (UNAVAILABLE, valueUnknown says why) where it cannot be told.
        "value": None if evaluation.value_unknown is not None else evaluation.value,
        "valueUnknown": evaluation.value_unknown,
        "active": None if evaluation.activity_unknown is not None else evaluation.active,
        "activityUnknown": evaluation.activity_unknown,
        "activationThreshold": spec.activation_threshold,
        "threshold": spec.threshold,
        "inferencePool": spec.inference_pool,
        "gatewayReplicas": replicas,
        # No value, no replica count: the HPA is given none to compute one from.
        "hpa": None if evaluation.value_unknown is not None else _hpa_json(evaluation),
    }


def triggers_named(explained: list[Explanation], metric: str) -> list[Explanation]:
    """The triggers /explain's `metric=` selects: the one whose metricName it is (compared as GetMetrics
    compares names, case-insensitively), else every trigger whose `metric` it is."""
    wanted = metric.lower()
    by_name = [e for e in explained if e.spec.metric_name.lower() == wanted]
    return by_name or [e for e in explained if e.spec.metric.value == wanted]


def _trigger_choice(index: int, explanation: Explanation) -> dict[str, Any]:
    """One trigger as an error lists it: its `trigger=INDEX` and its metadata (which tells apart two that
    share a metricName)."""
    return {"index": index, **_spec_json(explanation.spec)}


@dataclasses.dataclass(frozen=True, slots=True)
class Refusal:
    """/explain's answer when its query selects no trigger, or not one: the HTTP status and why."""

    status: int
    problem: str


def select_trigger(
    explained: list[Explanation], metric: str | None, index: str | None
) -> int | Refusal | None:
    """Which trigger /explain answers: None for all of them, else its position in `triggers`.

    `metric=` names a metric or metricName; `trigger=INDEX` is the 0-based position in the answer's
    `triggers` (the only way to tell apart two triggers that share a metricName)."""
    matching = explained if metric is None else triggers_named(explained, metric)
    named = [i for i, e in enumerate(explained) if any(e is m for m in matching)]
    if index is not None:
        if not index.isascii() or not index.isdigit() or len(index) > 4 or int(index) >= len(explained):
            return Refusal(
                400,
                f"trigger={index[:20]!r} is not a trigger of this ScaledObject: give a whole number from 0 to"
                f" {len(explained) - 1}, the trigger's position in `triggers`",
            )
        if int(index) not in named:
            return Refusal(
                400,
                f"trigger={int(index)} has metricName {explained[int(index)].spec.metric_name!r}, not"
                f" {(metric or '')[:100]!r}",
            )
        return int(index)
    if metric is None:
        return None
    if not named:
        return Refusal(404, f"no trigger of this ScaledObject has metric or metricName {metric[:100]!r}")
    if len(named) > 1:
        return Refusal(
            400,
            f"{len(named)} triggers have metric or metricName {metric[:100]!r}: add &trigger=INDEX, one of"
            f" {', '.join(map(str, named))} (the trigger's 0-based position in `triggers`)",
        )
    return named[0]


# What /explain takes: a misspelt parameter is an error, never the whole answer as if it were not given.
EXPLAIN_PARAMETERS = frozenset({"namespace", "name", "metric", "metricName", "trigger"})


def query_conflict(query: Iterable[tuple[str, str]]) -> str | None:
    """Why /explain's query chooses two things where it takes one, or None: a parameter given twice, or
    metric= and metricName= (one choice, SPEC §7) that differ. Never one of them picked silently."""
    seen: dict[str, str] = {}
    for key, value in query:
        if key in seen:
            return f"{key[:40]!r} is given twice, {seen[key][:100]!r} and {value[:100]!r}: give it once"
        seen[key] = value
    metric, metric_name = seen.get("metric"), seen.get("metricName")
    if metric is not None and metric_name is not None and metric != metric_name:
        return (
            f"metric={metric[:100]!r} and metricName={metric_name[:100]!r} differ: they are one choice of"
            " trigger, give one of them"
        )
    return None


# Explanations of a big namespace run to megabytes of JSON: built on a worker thread, not the event loop.
_JSON_OFF_LOOP_PODS = 200


class ExplanationSource(Protocol):
    def explanations(self, namespace: str, name: str) -> list[Explanation]: ...

    def explained(self) -> list[tuple[str, str]]: ...


def http_app(
    telemetry: Telemetry, explanations: ExplanationSource | None = None, admission: Admission | None = None
) -> web.Application:
    """/metrics, /healthz, /readyz, and /explain when `explanations` is given (--explain on); `admission`
    bounds what /explain may cost (default: admission.py's limits)."""
    gate = admission or Admission()

    rendering: asyncio.Future[bytes] | None = None

    async def metrics(_: web.Request) -> web.Response:
        # Thousands of label sets take long to render: off the loop, so gRPC calls are not held up. One
        # render at a time, shared by the scrapes that arrive meanwhile: each rendering thread competes
        # with the event loop for the interpreter, and 16 at once held gRPC answers up for seconds.
        nonlocal rendering
        if rendering is None:
            rendering = asyncio.ensure_future(asyncio.to_thread(generate_latest, telemetry.registry))

            def rendered(_: asyncio.Future[bytes]) -> None:
                nonlocal rendering
                rendering = None

            rendering.add_done_callback(rendered)
        body = await asyncio.shield(rendering)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        if telemetry.ready:
            return web.Response(text="ready\n")
        return web.Response(status=503, text="not ready\n")

    async def explain(request: web.Request) -> web.Response:
        # Refused before any work when too many are in flight or the budget is spent; an answer's size
        # is charged once it is known (a few dictionary look-ups later).
        wait = gate.admit(1.0)
        if wait is not None:
            return _too_many(wait)
        try:
            return await explain_answer(request)
        finally:
            gate.done()

    async def explain_answer(request: web.Request) -> web.Response:
        assert explanations is not None
        conflict = query_conflict(request.query.items())
        if conflict is not None:
            return web.json_response({"error": conflict}, status=400, dumps=_dumps)
        namespace = request.query.get("namespace", "")
        name = request.query.get("name", "")
        # A bad request is told so whatever it names (docs/operating.md: an unknown parameter is a 400).
        unknown = sorted(set(request.query) - EXPLAIN_PARAMETERS)
        if unknown:
            allowed = ", ".join(sorted(EXPLAIN_PARAMETERS))
            problem = f"{unknown[0][:40]!r} is not a parameter of /explain; give {allowed}"
            return web.json_response({"error": problem}, status=400, dumps=_dumps)
        if not namespace or not name:
            # Only a bare /explain lists every ScaledObject (docs/SECURITY.md); a request naming a
            # namespace is shown that namespace's, and any other request none.
            bare = not request.query
            followed = [
                key for key in explanations.explained() if bare or (namespace and key[0] == namespace)
            ]
            wait = gate.charge(explain_cost(len(followed)))
            if wait is not None:
                return _too_many(wait)
            known = [{"namespace": ns, "name": n} for ns, n in followed]
            return web.json_response(
                {"error": "give ?namespace=NS&name=SCALEDOBJECT", "known": known}, status=400, dumps=_dumps
            )
        explained = explanations.explanations(namespace, name)
        if not explained:
            return web.json_response(
                {"error": f"no evaluation yet for ScaledObject {namespace[:100]}/{name[:100]}"},
                status=404,
                dumps=_dumps,
            )
        metric = request.query.get("metric", request.query.get("metricName"))  # SPEC §7 names both
        selector = select_trigger(explained, metric, request.query.get("trigger"))
        if isinstance(selector, Refusal):
            listed = [_trigger_choice(i, e) for i, e in enumerate(explained)]
            return web.json_response(
                {"error": selector.problem, "triggers": listed}, status=selector.status, dumps=_dumps
            )
        one = selector
        shown = explained if one is None else [explained[one]]
        pods = sum(
            len(e.evaluation.pod_rows) + len(e.evaluation.missing_pods)
            for e in shown
            if e.evaluation is not None
        )

        def render() -> str:
            if one is not None:
                return _dumps({"index": one} | explanation_json(namespace, name, explained[one]))
            return _dumps(
                {
                    "namespace": namespace,
                    "scaledObject": name,
                    "triggers": [
                        {"index": i} | explanation_json(namespace, name, e) for i, e in enumerate(explained)
                    ],
                }
            )

        wait = gate.charge(explain_cost(pods))
        if wait is not None:
            return _too_many(wait)
        text = await asyncio.to_thread(render) if pods > _JSON_OFF_LOOP_PODS else render()
        return web.Response(text=text, content_type="application/json")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    if explanations is not None:
        app.router.add_get("/explain", explain)
    return app


def _too_many(wait: float) -> web.Response:
    return web.json_response(
        {
            "error": "too many /explain requests now (in flight or in the last seconds); try again after"
            f" {wait:g} s"
        },
        status=429,
        headers={"Retry-After": f"{math.ceil(wait)}"},
    )


def _dumps(value: Any) -> str:
    return json.dumps(value, indent=2, default=str)
