"""PromQL text for the Prometheus source, written from the vendor modules' names only.

Every value that reaches a query (a namespace, a GPU UUID, a job or instance) is quoted here: as a string
literal, or as an RE2 pattern matching only itself. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from keda_gpu_scaler.pages.engines import ENGINE_SAMPLE_NAMES
from keda_gpu_scaler.pages.engines import POD_LABELS as ENGINE_POD_LABELS
from keda_gpu_scaler.pages.exposition import Sample
from keda_gpu_scaler.pages.gateways import GATEWAY_SAMPLE_NAMES
from keda_gpu_scaler.pages.vendors import POD_LABELS, SAMPLE_NAMES, VENDORS

# Label put on the sample-time half of a query's answer, so one instant query brings values and times.
TIMESTAMP_LABEL = "keda_gpu_scaler_timestamp"

Target = tuple[str, str]
"""(job, instance): the scrape target, i.e. the exporter, a series came from."""

Matcher = tuple[str, str, str]
"""(label, operator, value), the value unquoted."""


def promql_string(value: str) -> str:
    """A double-quoted PromQL string literal (Go quoting) holding exactly `value`."""
    out = ['"']
    for char in value:
        if char in '\\"':
            out.append("\\" + char)
        elif char < " " or char == "\x7f":
            # Control characters as escapes: a raw newline would end the literal in some parsers.
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


_RE2_SPECIAL = frozenset("\\.+*?()|[]{}^$")


def regex_literal(value: str) -> str:
    """`value` as an RE2 pattern matching only itself (PromQL anchors =~ at both ends)."""
    return "".join("\\" + char if char in _RE2_SPECIAL else char for char in value)


def any_of(values: Iterable[str]) -> str:
    """An RE2 alternation of literal values, sorted so that one set always gives one query text."""
    return "|".join(regex_literal(v) for v in sorted(set(values)))


def selector(matchers: Sequence[Matcher]) -> str:
    return "{" + ",".join(f"{label}{op}{promql_string(value)}" for label, op, value in matchers) + "}"


def values_and_times(names: Collection[str], branches: Sequence[Sequence[Matcher]]) -> str:
    """One instant query for the series of `names` matching any branch: values, and their sample times.

    A plain instant query reports every value at the evaluation time, hiding how old the sample is (up to
    the 5 minute lookback). timestamp() of a selector gives the true sample time but drops the name, so
    it is applied per family (names dropped, one family's series stay distinct) and the times are marked
    with TIMESTAMP_LABEL to keep them apart from the values. `or` keeps one element per label set: the
    time of a set is that of whichever family comes first, which is the same scrape's.
    """
    name_matcher: Matcher = ("__name__", "=~", any_of(names))
    values = " or ".join(selector([name_matcher, *branch]) for branch in branches)
    times = " or ".join(
        f"timestamp({selector([('__name__', '=', name), *branch])})"
        for branch in branches
        for name in sorted(names)
    )
    return f'({values}) or label_replace({times}, "{TIMESTAMP_LABEL}", "1", "", "")'


def namespace_query(namespace: str, exporter_namespaces: Collection[str] | None) -> str:
    """The series of every pod-label pair naming a pod of `namespace` (a superset: the vendors decide).

    Only the plain `namespace`/`pod` pair is taken from any scrape target. The others (`exported_*`, dcgm's
    `--use-old-namespace` pair, ACK's) are what a page printed about some other pod, so they count only
    from targets in `exporter_namespaces` (--exporter-namespaces; None: any), as the scrape path reads
    exporter pods there only: a tenant's own pod printing exporter-like series about another tenant's
    pod (they arrive as `exported_*`) must not speak for it.
    """
    trusted = _exporter_targets(exporter_namespaces)
    branches = [
        [(ns_key, "=", namespace), (pod_key, "!=", ""), *([] if ns_key == "namespace" else trusted)]
        for ns_key, pod_key in POD_LABELS
    ]
    return values_and_times(SAMPLE_NAMES, branches)


def _exporter_targets(exporter_namespaces: Collection[str] | None) -> list[Matcher]:
    """The matcher for series scraped from a target in one of the exporters' namespaces (none: any)."""
    return [] if exporter_namespaces is None else [("namespace", "=~", any_of(exporter_namespaces))]


def inference_query(namespace: str, exporter_namespaces: Collection[str] | None) -> str:
    """The inference servers' series (SPEC §6) of the pods of `namespace`, with their sample times.

    Two label pairs name the pod: `namespace`/`pod` as Prometheus' Kubernetes service discovery attaches
    them to a scraped pod, and `exported_namespace`/`exported_pod` where the workload's own labels were
    renamed on the way (honor_labels false, a federation, a metrics proxy). The `exported_*` pair is what a
    page printed about itself: it counts only from targets in `namespace` itself or in
    `exporter_namespaces` (--exporter-namespaces; None: any), or a tenant's own pod printing vLLM series
    labelled with another tenant's pods would add load to that tenant's trigger. Family names may hold
    colons (`vllm:num_requests_waiting`): legal in metric names, and no RE2 metacharacter. A series that
    matches a branch but names another namespace in the pair read first (engines.pod_of) is the caller's
    to drop.

    With them, Prometheus' own `up` of every scrape target naming a pod of `namespace` (Kubernetes service
    discovery's `namespace`/`pod`): a pod whose server has failed every scrape since the scaler started
    has no other series to name it, and must count as a missing pod, not as no pod (SPEC §4).
    """
    speaking = _exporter_targets(None if exporter_namespaces is None else {namespace, *exporter_namespaces})
    branches = [
        [(ns_key, "=", namespace), (pod_key, "!=", ""), *([] if ns_key == "namespace" else speaking)]
        for ns_key, pod_key in ENGINE_POD_LABELS
    ]
    targets = values_and_times(["up"], [[("namespace", "=", namespace), ("pod", "!=", "")]])
    return f"{values_and_times(ENGINE_SAMPLE_NAMES, branches)} or {targets}"


def gateway_query(namespace: str, pool: str) -> str:
    """The endpoint pickers' series (SPEC §7) of one InferencePool, with their sample times.

    By `inference_pool` (the pool's name, or `namespace/name` as some EPPs print it) and `namespace`, the
    label Prometheus' Kubernetes service discovery gives the series of a scraped EPP pod: the EPP runs in
    its pool's namespace, and a pool of another namespace never matches.
    """
    branch: list[Matcher] = [
        ("namespace", "=", namespace),
        ("inference_pool", "=~", any_of((pool, f"{namespace}/{pool}"))),
    ]
    return values_and_times(GATEWAY_SAMPLE_NAMES, [branch])


def up_query(namespace: str, pods: Collection[str], targets: Collection[Target]) -> str:
    """Prometheus' own `up` series, with their sample times, of the scrape targets that served these pods.

    Asked by both things that tie a target to a pod: the (job, instance) its series came from, and the
    target labels naming the pod (`namespace`/`pod` from Kubernetes service discovery). Both branches
    are supersets (job and instance are matched separately, like liveness_query): the caller keeps
    the exact ones (prometheus_answer.lost_pod).
    """
    branches: list[list[Matcher]] = []
    if pods:
        branches += [
            [(ns_key, "=", namespace), (pod_key, "=~", any_of(pods))] for ns_key, pod_key in ENGINE_POD_LABELS
        ]
    named = [(job, instance) for job, instance in targets if job or instance]
    if named:
        branches.append(
            [
                ("job", "=~", any_of(job for job, _ in named)),
                ("instance", "=~", any_of(instance for _, instance in named)),
            ]
        )
    return values_and_times(["up"], branches)


def gpu_queries(samples: Iterable[Sample], exporter_namespaces: Collection[str] | None) -> list[str]:
    """For vendors that need them, all series of the GPUs the given samples are on (device-level, other pods).

    A namespace's own series are not enough there: dcgm-exporter's per-pod values on a shared GPU are told
    from copies of the device value only beside the GPU's device-level series, and a copy shared by pods
    of two namespaces must count for neither. With the whole GPU fetched, readings match direct scraping.
    As in namespace_query, a series naming its pod by any pair but `namespace`/`pod` counts only from a
    target in `exporter_namespaces`: a look-alike exporter printing a real GPU's ID cannot join it.
    """
    samples = list(samples)
    trusted = _exporter_targets(exporter_namespaces)
    # No pod named but by `namespace`/`pod` (or none at all: device-level series).
    plain: list[Matcher] = [(pod_key, "=", "") for _, pod_key in POD_LABELS if pod_key != "pod"]
    kinds = [trusted, plain] if trusted else [[]]
    queries = []
    for vendor in VENDORS:
        ids: dict[str, set[str]] = {label: set() for label in vendor.gpu_id_labels}
        for sample in samples:
            if sample.name in vendor.sample_names:
                for label in vendor.gpu_id_labels:
                    if value := sample.labels.get(label):
                        ids[label].add(value)
        branches = [
            [(label, "=~", any_of(values)), *kind]
            for label, values in ids.items()
            if values
            for kind in kinds
        ]
        if branches:
            queries.append(values_and_times(vendor.sample_names, branches))
    return queries


def liveness_query(targets: Collection[Target]) -> str:
    """The newest sample time of any GPU series of each target (exporter)."""
    matchers: list[Matcher] = [
        ("job", "=~", any_of(job for job, _ in targets)),
        ("instance", "=~", any_of(instance for _, instance in targets)),
    ]
    times = " or ".join(
        f"timestamp({selector([('__name__', '=', name), *matchers])})" for name in sorted(SAMPLE_NAMES)
    )
    return f"max by (job, instance) ({times})"


def attribution_query(targets: Collection[Target]) -> str:
    """The pod-label pairs on the fresh GPU series of each target (exporter): whether its page names pods."""
    keys = ", ".join(sorted({key for pair in POD_LABELS for key in pair}))
    matchers: list[Matcher] = [
        ("__name__", "=~", any_of(SAMPLE_NAMES)),
        ("job", "=~", any_of(job for job, _ in targets)),
        ("instance", "=~", any_of(instance for _, instance in targets)),
    ]
    return f"group by (job, instance, {keys}) ({selector(matchers)})"


def fleet_query() -> str:
    """Whether Prometheus holds any current series of any GPU exporter family at all."""
    return f"group({selector([('__name__', '=~', any_of(SAMPLE_NAMES))])})"


# How far back a job counts as one that serves GPU series: every sample of the last few minutes, then
# a look every few minutes over the hour (see down_exporters_query).
GPU_JOBS_RECENT, GPU_JOBS_LOOKBACK, GPU_JOBS_STEP = "5m", "1h", "5m"


def down_exporters_query() -> str:
    """The scrape targets Prometheus finds down (`up` 0) in the jobs that serve GPU exporter series: while
    one is, a namespace with no series may have pods there (SPEC §4). Jobs, not targets: a down target's
    own GPU series are gone, and its job's live targets name the job.

    A job whose every target is down has no current GPU series to name it, so the jobs that had any
    lately count too: within the last 5 minutes by every sample (`last_over_time`), and within the hour
    by a look every 5 minutes (a subquery: 13 instant looks at the GPU series). Reading every sample of
    the hour instead (`last_over_time(...[1h])`) costs each series its hundreds of samples, a fleet's
    millions, on each check; a job down since more than the hour before the scaler started is not seen.
    """
    gpu = selector([("__name__", "=~", any_of(SAMPLE_NAMES))])
    recent = f"group by (job) (last_over_time({gpu}[{GPU_JOBS_RECENT}]))"
    hour = f"max_over_time(group by (job) ({gpu})[{GPU_JOBS_LOOKBACK}:{GPU_JOBS_STEP}])"
    return f"(up == 0) and on (job) ({recent} or {hour})"
