"""Prometheus source: the wanted namespaces' GPU series, with their sample times, from a PromQL query API."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import random
import ssl
import time
from collections.abc import Callable, Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from keda_gpu_scaler.collect.scrape import JITTER, Interest, PageTooLarge, describe_error, read_limited
from keda_gpu_scaler.collect.store import RECENTLY_SEEN_SECONDS, Page, SourceKind, Store
from keda_gpu_scaler.exposition import Sample
from keda_gpu_scaler.settings import Settings, SettingsError
from keda_gpu_scaler.telemetry import Telemetry
from keda_gpu_scaler.vendors import POD_LABELS, SAMPLE_NAMES, VENDORS, readings_from_samples

log = logging.getLogger(__name__)

PROMETHEUS_INTEREST = "prometheus"

# Label put on the sample-time half of a query's answer, so one instant query brings values and times.
TIMESTAMP_LABEL = "keda_gpu_scaler_timestamp"

# One upstream serves every namespace: a failing one is retried at most this many intervals apart, so
# data comes back soon after Prometheus (or a refreshed token) does, without a query storm meanwhile.
MAX_BACKOFF_INTERVALS = 4
QUERIES_IN_FLIGHT = 8

Target = tuple[str, str]
"""(job, instance): the scrape target, i.e. the exporter, a series came from."""

Matcher = tuple[str, str, str]
"""(label, operator, value), the value unquoted."""


def sample_window(max_staleness: float, interval: float) -> float:
    """How old a sample may be when queried to be used.

    A sample is used while it is at most max-staleness old, and a collection's result is reused until
    the next one, so at query time it may be at most max-staleness less one interval old.
    """
    return max_staleness - interval if max_staleness > interval else max_staleness


def prometheus_interest(namespace: str) -> tuple[str, str]:
    return (PROMETHEUS_INTEREST, namespace)


class PrometheusError(Exception):
    """A query that gave no usable answer; the message says why, for the store and the RPC's status."""


# --- PromQL, written from the vendor modules' names only; every value is quoted here ---------------------


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


def namespace_query(namespace: str) -> str:
    """The series of every pod-label pair naming a pod of `namespace` (a superset: the vendors decide)."""
    branches = [[(ns_key, "=", namespace), (pod_key, "!=", "")] for ns_key, pod_key in POD_LABELS]
    return values_and_times(SAMPLE_NAMES, branches)


def gpu_queries(samples: Iterable[Sample]) -> list[str]:
    """For vendors that need them, all series of the GPUs the given samples are on (device-level, other pods).

    A namespace's own series are not enough there: dcgm-exporter's per-pod values on a shared GPU are told
    from copies of the device value only beside the GPU's device-level series, and a copy shared by pods
    of two namespaces must count for neither. With the whole GPU fetched, readings match direct scraping.
    """
    samples = list(samples)
    queries = []
    for vendor in VENDORS:
        ids: dict[str, set[str]] = {label: set() for label in vendor.gpu_id_labels}
        for sample in samples:
            if sample.name in vendor.sample_names:
                for label in vendor.gpu_id_labels:
                    if value := sample.labels.get(label):
                        ids[label].add(value)
        branches = [[(label, "=~", any_of(values))] for label, values in ids.items() if values]
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


def fleet_query() -> str:
    """Whether Prometheus holds any current series of any GPU exporter family at all."""
    return f"group({selector([('__name__', '=~', any_of(SAMPLE_NAMES))])})"


# --- answers ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Element:
    """One element of an instant vector."""

    labels: dict[str, str]
    value: float


def parse_vector(body: bytes) -> tuple[list[Element], list[str]]:
    """The elements and warnings of a /api/v1/query answer; PrometheusError for anything else."""
    try:
        document = json.loads(body)
    # UnicodeDecodeError is a ValueError too; RecursionError: nested deeper than the decoder goes.
    except (ValueError, RecursionError) as error:
        raise PrometheusError(f"the answer is not JSON ({error})") from None
    if not isinstance(document, dict):
        raise PrometheusError("the answer is not a Prometheus API response")
    if document.get("status") != "success":
        raise PrometheusError(_api_error(document) or f"status {document.get('status')!r}")
    data = document.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("result"), list):
        raise PrometheusError("the answer has no data.result")
    if data.get("resultType") != "vector":
        raise PrometheusError(f"the answer is a {data.get('resultType')!r}, not an instant vector")
    elements = []
    for item in data["result"]:
        metric = item.get("metric") if isinstance(item, dict) else None
        pair = item.get("value") if isinstance(item, dict) else None
        if (
            not isinstance(metric, dict)
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in metric.items())
            or not isinstance(pair, list)
            or len(pair) != 2
            or not isinstance(pair[1], str)
        ):
            raise PrometheusError(f"malformed vector element: {str(item)[:200]}")
        try:
            value = float(pair[1])  # also "NaN", "+Inf", "-Inf"
        except ValueError:
            raise PrometheusError(f"malformed sample value {pair[1][:50]!r}") from None
        elements.append(Element(metric, value))
    warnings = document.get("warnings")
    return elements, [str(w) for w in warnings] if isinstance(warnings, list) else []


def _api_error(document: Any) -> str | None:
    if isinstance(document, dict) and document.get("error"):
        kind = document.get("errorType")
        return f"{kind}: {document['error']}"[:300] if kind else str(document["error"])[:300]
    return None


def samples_with_times(elements: Iterable[Element]) -> list[Sample]:
    """The value elements as Samples stamped with their own sample time.

    A value without a time is left out: the two halves of the query read the series one after the
    other, so a series that appeared in between has only one of them; the next collection has both.
    """
    times: dict[frozenset[tuple[str, str]], float] = {}
    values: list[Element] = []
    for element in elements:
        if "__name__" in element.labels:
            values.append(element)
        elif element.labels.get(TIMESTAMP_LABEL) == "1":
            labels = {k: v for k, v in element.labels.items() if k != TIMESTAMP_LABEL}
            times[frozenset(labels.items())] = element.value
    samples = []
    for element in values:
        labels = dict(element.labels)
        name = labels.pop("__name__")
        at = times.get(frozenset(labels.items()))
        if at is not None:
            samples.append(Sample(name, labels, element.value, round(at * 1000)))
    return samples


def _merged(*parts: Iterable[Sample]) -> list[Sample]:
    """One sample per series: the GPU queries return the namespace's own series again."""
    seen: set[tuple[str, frozenset[tuple[str, str]]]] = set()
    result = []
    for part in parts:
        for sample in part:
            key = (sample.name, frozenset(sample.labels.items()))
            if key not in seen:
                seen.add(key)
                result.append(sample)
    return result


def target_of(labels: dict[str, str]) -> Target:
    return labels.get("job", ""), labels.get("instance", "")


def _seconds(sample: Sample) -> float:
    return (sample.timestamp_ms or 0) / 1000


# --- HTTP ---------------------------------------------------------------------------------------------


class SecretFile:
    """A secret kept in a file and read again whenever the file changes.

    Tokens refreshed by workload identity or a sidecar are rewritten in place, or swapped in through a
    symlink as Kubernetes does for Secret volumes: a new inode, size or mtime means a new secret.
    """

    def __init__(self, path: Path, flag: str) -> None:
        self._path = path
        self._flag = flag
        self._version: tuple[int, int, int] | None = None
        self._value = ""

    def read(self) -> str:
        try:
            stat = os.stat(self._path)
            version = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
            if version != self._version:
                value = self._path.read_text().strip()
                if not value:
                    raise PrometheusError(f"{self._flag}: {self._path} is empty")
                self._value, self._version = value, version
                log.info("read %s from %s", self._flag, self._path)
        except OSError as error:
            raise PrometheusError(f"{self._flag}: cannot read {self._path}: {error.strerror}") from None
        return self._value


class Credentials:
    """The headers every query carries: the configured extra headers, then bearer or basic auth."""

    def __init__(self, settings: Settings) -> None:
        self._headers = dict(settings.prometheus_headers)
        token = settings.prometheus_bearer_token_file
        self._token = SecretFile(token, "--prometheus-bearer-token-file") if token else None
        self._username = settings.prometheus_username
        self._password = settings.prometheus_password
        password_file = settings.prometheus_password_file
        self._password_file = (
            SecretFile(password_file, "--prometheus-password-file") if password_file else None
        )

    def headers(self) -> dict[str, str]:
        headers = dict(self._headers)
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token.read()}"
        elif self._username is not None:
            password = self._password_file.read() if self._password_file else self._password or ""
            # RFC 7617 with UTF-8: user-id ":" password, base64.
            pair = base64.b64encode(f"{self._username}:{password}".encode()).decode()
            headers["Authorization"] = f"Basic {pair}"
        return headers


def prometheus_ssl(settings: Settings) -> ssl.SSLContext | bool:
    """The TLS context for the Prometheus API: a private CA and a client certificate when configured."""
    ca, cert, key = settings.prometheus_ca_file, settings.prometheus_cert_file, settings.prometheus_key_file
    if ca is None and cert is None:
        return True  # the system's trust store
    try:
        context = ssl.create_default_context(cafile=str(ca) if ca else None)
        if cert is not None:
            context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as error:
        raise SettingsError(
            f"--prometheus-ca-file/--prometheus-cert-file/--prometheus-key-file: {error}"
        ) from None
    return context


def _http_error(response: aiohttp.ClientResponse, body: bytes) -> str:
    message = f"HTTP {response.status} {response.reason or ''}".strip()
    try:
        detail = _api_error(json.loads(body))
    except (ValueError, RecursionError):
        detail = None
    if detail:
        message += f": {detail}"
    if response.status in (401, 403):
        message += (
            " (check the credentials: --prometheus-bearer-token-file, or --prometheus-username with"
            " --prometheus-password-file or KEDA_GPU_SCALER_PROMETHEUS_PASSWORD)"
        )
    elif 300 <= response.status < 400:
        message += (
            f" (redirect to {response.headers.get('Location', '?')}: give that URL as --prometheus-url)"
        )
    return message


class PrometheusClient:
    """Instant queries against /api/v1/query; every failure becomes a PrometheusError saying why."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        settings: Settings,
        telemetry: Telemetry,
        clock: Callable[[], float],
    ) -> None:
        assert settings.prometheus_url is not None
        self._session = session
        self._url = settings.prometheus_url.rstrip("/") + "/api/v1/query"
        self._timeout = settings.prometheus_timeout
        self._max_bytes = settings.max_page_bytes
        self._credentials = Credentials(settings)
        self._telemetry = telemetry
        self._clock = clock
        self._in_flight = asyncio.Semaphore(QUERIES_IN_FLIGHT)

    async def query(self, promql: str, at: float, purpose: str) -> list[Element]:
        """Evaluate `promql` at wall-clock time `at` (seconds); `purpose` labels the query counter."""
        form = {
            "query": promql,
            "time": f"{at:.3f}",
            # Thanos answers with part of the data when a store is down unless told not to; the others
            # ignore the parameter. Part of the data would look like pods gone.
            "partial_response": "false",
        }
        async with self._in_flight:
            started = self._clock()
            try:
                elements, warnings = parse_vector(await self._post(form))
            except PrometheusError:
                self._count(purpose, "error", started)
                raise
        self._count(purpose, "ok", started)
        if warnings:
            log.debug("Prometheus warnings for a %s query: %s", purpose, "; ".join(warnings))
        return elements

    async def _post(self, form: dict[str, str]) -> bytes:
        """The body of a 200 answer; PrometheusError saying why there is none."""
        try:
            async with self._session.post(
                self._url,
                data=form,
                headers=self._credentials.headers(),
                timeout=aiohttp.ClientTimeout(total=self._timeout),
                # A redirect could carry the credentials to another host.
                allow_redirects=False,
            ) as response:
                body = await read_limited(response, self._max_bytes)
        except PageTooLarge as error:
            raise PrometheusError(f"answer too large: {error}") from None
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise PrometheusError(describe_error(error, self._timeout)) from None
        if response.status != 200:
            raise PrometheusError(_http_error(response, body))
        return body

    def _count(self, purpose: str, result: str, started: float) -> None:
        self._telemetry.prometheus_queries.labels(purpose, result).inc()
        self._telemetry.prometheus_query_duration.observe(self._clock() - started)


# --- the collector ------------------------------------------------------------------------------------


@dataclass(slots=True)
class _TargetSource:
    source: str
    collected_at: float  # monotonic time of its last page


class PrometheusCollector:
    """Per wanted namespace, one loop: query, normalise, store one page per exporter behind Prometheus.

    Pages are kept per scrape target (job, instance), not per namespace, so that the store treats each
    exporter behind Prometheus as it treats one scraped directly: a target whose series go stale makes its
    pods count as missing (one dead exporter cannot shrink the value), while a target still scraped that
    no longer names a pod means the pod is gone. A per-namespace source records whether Prometheus answers.
    """

    def __init__(
        self,
        *,
        client: PrometheusClient,
        store: Store,
        interest: Interest,
        interval: float,
        max_staleness: float,
        clock: Callable[[], float],
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._store = store
        self._interest = interest
        self._interval = interval
        self._window = sample_window(max_staleness, interval)
        self._clock = clock
        self._wall = wall_clock
        self._targets: dict[str, dict[Target, _TargetSource]] = {}
        self._failing: set[str] = set()
        self._told_no_sample_times = False
        self._fleet_seen_until = float("-inf")
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._supervisor: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._supervisor = asyncio.create_task(self._supervise(), name="prometheus namespaces")

    async def stop(self) -> None:
        tasks = [t for t in (self._supervisor, *self._tasks.values()) if t is not None]
        self._supervisor = None
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _supervise(self) -> None:
        # Never touched: waiting "until it is wanted" wakes on the first touch of any key, i.e. on a
        # namespace asking for the first time, which then gets its data without waiting an interval.
        any_new_interest: Hashable = object()
        while True:
            for key in self._interest.wanted_keys():
                if isinstance(key, tuple) and len(key) == 2 and key[0] == PROMETHEUS_INTEREST:
                    namespace = str(key[1])
                    if namespace not in self._tasks:
                        self._tasks[namespace] = asyncio.create_task(
                            self._run(namespace), name=f"prometheus {namespace}"
                        )
            await self._interest.wait_until_wanted(self._interval, any_new_interest)

    async def _run(self, namespace: str) -> None:
        key = prometheus_interest(namespace)
        failures = 0
        try:
            while self._interest.wanted(key):
                try:
                    ok = await self.collect_once(namespace)
                except Exception:
                    # A bug must not end the namespace's collection for good: its data goes stale and
                    # the calls say UNAVAILABLE, the log says why, and the next round tries again.
                    log.exception("Prometheus source, namespace %s: collection failed", namespace)
                    ok = False
                failures = 0 if ok else failures + 1
                delay = self._interval * min(2 ** max(failures - 1, 0), MAX_BACKOFF_INTERVALS)
                # Jitter only shortens the wait: data must never be older than one interval because of it.
                await asyncio.sleep(delay * random.uniform(1 - JITTER, 1))
            self._forget(namespace)
        finally:
            if self._tasks.get(namespace) is asyncio.current_task():
                del self._tasks[namespace]

    def _forget(self, namespace: str) -> None:
        """No trigger asks for the namespace any more: drop its sources (a new call starts again)."""
        for target in self._targets.pop(namespace, {}).values():
            self._store.remove_source(target.source)
        self._store.remove_source(_namespace_source(namespace))
        self._failing.discard(namespace)

    async def collect_once(self, namespace: str) -> bool:
        """Query Prometheus for one namespace now and store the result. True when Prometheus answered."""
        # Whole milliseconds: the evaluation time sent is then exactly the one compared with below.
        at, now = round(self._wall() * 1000) / 1000, self._clock()
        source = _namespace_source(namespace)
        self._store.add_source(source, SourceKind.PROMETHEUS, namespace)
        known = self._targets.setdefault(namespace, {})
        try:
            samples = samples_with_times(
                await self._client.query(namespace_query(namespace), at, "namespace")
            )
            for query in gpu_queries(samples):
                more = samples_with_times(await self._client.query(query, at, "gpus"))
                samples = _merged(samples, more)
            by_target: dict[Target, list[Sample]] = {}
            for sample in samples:
                by_target.setdefault(target_of(sample.labels), []).append(sample)
            lost = [target for target in known if target not in by_target]
            alive = await self._alive(lost, at) if lost else set()
            if not by_target and not known:
                await self._check_fleet(at)
        except PrometheusError as error:
            message = str(error)
            # Said once, on the namespace's source; the targets' pages just age ("last data 5.2s old").
            self._store.record_failure(source, message)
            if namespace not in self._failing:
                self._failing.add(namespace)
                log.warning("Prometheus source, namespace %s: %s", namespace, message)
            return False
        if samples and all(s.timestamp_ms == round(at * 1000) for s in samples):
            self._no_sample_times()
        if namespace in self._failing:
            self._failing.discard(namespace)
            log.info("Prometheus source, namespace %s: answering again", namespace)

        for target, series in by_target.items():
            self._record_target(namespace, target, series, at, now)
        for target in lost:
            state = known[target]
            if target in alive or now - state.collected_at > RECENTLY_SEEN_SECONDS:
                # Still scraped but naming no pod of the namespace: those pods are gone. Or down for so
                # long that its pods no longer count as missing either.
                self._store.remove_source(state.source)
                del known[target]
            else:
                self._store.record_failure(
                    state.source,
                    "no current series in Prometheus (exporter down or not scraped any more?)",
                )
        # Empty, but under the namespace's name: waiters on that namespace hear of failures and recoveries.
        self._store.record_page(Page(source, now, {namespace: ()}))
        return True

    def _no_sample_times(self) -> None:
        # A server whose timestamp() gives the evaluation time rather than the sample's own makes every
        # series look fresh: its staleness handling then stands alone. Say so once.
        if not self._told_no_sample_times:
            self._told_no_sample_times = True
            log.warning(
                "the Prometheus API reports every sample as taken at the query time: the age of its data"
                " cannot be checked against --max-staleness"
            )

    def _record_target(
        self, namespace: str, target: Target, series: list[Sample], at: float, now: float
    ) -> None:
        fresh = [s for s in series if at - _seconds(s) <= self._window]
        # A target whose every series is stale keeps a page as old as its newest sample, so that its pods
        # count as missing (and the error says how old the data is) instead of vanishing.
        used = fresh or series
        times = [_seconds(s) for s in used]
        # The page is as old as its oldest sample: none of its readings is used once stale.
        as_of = min(times) if fresh else max(times)
        collected_at = now - max(0.0, at - as_of)
        known = self._targets[namespace]
        state = known.get(target)
        if state is None:
            job, instance = target
            name = (
                f"{_namespace_source(namespace)} {job}/{instance}"
                if job or instance
                else f"{_namespace_source(namespace)} (no job/instance)"
            )
            state = known[target] = _TargetSource(name, collected_at)
            self._store.add_source(name, SourceKind.PROMETHEUS, namespace)
        state.collected_at = collected_at
        self._store.record_page(Page.from_readings(state.source, collected_at, readings_from_samples(used)))

    async def _alive(self, targets: Sequence[Target], at: float) -> set[Target]:
        """Which of these targets Prometheus still scrapes: any GPU series of theirs is fresh."""
        # Series without job/instance cannot be asked about; Prometheus' staleness is trusted for them.
        alive = {t for t in targets if t == ("", "")}
        asked = [t for t in targets if t != ("", "")]
        if asked:
            for element in await self._client.query(liveness_query(asked), at, "liveness"):
                target = target_of(element.labels)
                if target in asked and at - element.value <= self._window:
                    alive.add(target)
        return alive

    async def _check_fleet(self, at: float) -> None:
        """A namespace without any series is 0 only when Prometheus holds GPU series at all.

        Otherwise a Prometheus that does not scrape the exporters (a wrong URL, a broken ServiceMonitor)
        would read as "no pods" everywhere, and KEDA would scale every workload to zero.
        """
        if at < self._fleet_seen_until:
            return
        if not await self._client.query(fleet_query(), at, "fleet"):
            raise PrometheusError(
                "Prometheus holds no current series of any GPU exporter family: is it scraping the exporters?"
            )
        self._fleet_seen_until = at + self._interval


def _namespace_source(namespace: str) -> str:
    return f"prometheus {namespace}"
