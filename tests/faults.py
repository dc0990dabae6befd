"""Exporter faults used by the reliability tests, and the behaviour each must produce (docs/RELIABILITY.md)."""

from __future__ import annotations

import asyncio
import functools
import gzip
import zlib
from dataclasses import dataclass

from aiohttp import web

HEALTHY_PAGE_LINE = (
    'DCGM_FI_DEV_GPU_UTIL{{gpu="{gpu}",UUID="GPU-{gpu}",device="nvidia{gpu}",modelName="NVIDIA H100 80GB HBM3",'
    'Hostname="faulty-node",container="main",namespace="llm",pod="{pod}"}} {value}'
)


def page(*lines: str) -> str:
    return (
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
        + "\n".join(lines)
        + "\n"
    )


def line(pod: str, value: str, gpu: int = 0) -> str:
    return HEALTHY_PAGE_LINE.format(pod=pod, value=value, gpu=gpu)


@dataclass(frozen=True)
class Fault:
    name: str
    description: str
    # UNAVAILABLE: the affected trigger answers UNAVAILABLE (never 0/false); otherwise the exact value.
    expected: str | float
    behaviour: str


FAULTS: tuple[Fault, ...] = (
    Fault(
        "slow",
        "exporter answers after the scrape timeout",
        "UNAVAILABLE",
        "scrape times out; once the last data is older than --max-staleness: UNAVAILABLE",
    ),
    Fault(
        "refused", "nothing listens on the exporter's port", "UNAVAILABLE", "connection refused; UNAVAILABLE"
    ),
    Fault("reset", "connection reset in the middle of the body", "UNAVAILABLE", "scrape fails; UNAVAILABLE"),
    Fault(
        "http_500", "exporter answers HTTP 500", "UNAVAILABLE", "scrape fails with 'HTTP 500'; UNAVAILABLE"
    ),
    Fault(
        "truncated",
        "page cut in the middle of a sample line",
        "UNAVAILABLE",
        "page rejected as not valid exposition (line named); UNAVAILABLE",
    ),
    Fault(
        "garbage",
        "random bytes instead of a page",
        "UNAVAILABLE",
        "page rejected (invalid UTF-8 or syntax); UNAVAILABLE",
    ),
    Fault(
        "huge",
        "a 100 MB body",
        "UNAVAILABLE",
        "read stops at --max-page-bytes; page refused; memory bounded by the cap; UNAVAILABLE",
    ),
    Fault(
        "nan_inf",
        "NaN and +Inf values for every GPU of the target",
        "UNAVAILABLE",
        "samples dropped; the pods have no value (missing); fewer than half fresh: UNAVAILABLE",
    ),
    Fault("negative_huge", "values -5 and 1e300", 100.0, "clamped to 0 and 100 per GPU: value 100"),
    Fault("duplicates", "every series printed twice", 60.0, "counted once: value 60"),
    Fault(
        "conflicting",
        "one series printed twice with different values",
        "UNAVAILABLE",
        "page refused naming the series, both values and their lines (neither can be trusted); UNAVAILABLE",
    ),
    Fault(
        "gzip_bomb",
        "a 400 kB gzip body that inflates to 200 MB",
        "UNAVAILABLE",
        "decompressed bytes count against --max-page-bytes: refused at the cap, memory bounded; UNAVAILABLE",
    ),
    Fault(
        "gzip_cut",
        "a gzip page whose stream ends mid-value (it inflates to a valid page reading 3 for 30)",
        "UNAVAILABLE",
        "refused: the gzip stream has no end (truncated), never the lower value; UNAVAILABLE",
    ),
    Fault(
        "gzip_invalid",
        "Content-Encoding: gzip on a body that is not gzip",
        "UNAVAILABLE",
        "scrape fails naming the body as not valid gzip; the scrape loop goes on; UNAVAILABLE",
    ),
    Fault(
        "many_series",
        "a 0.8 MB page of 21,000 series (more than one page may give)",
        "UNAVAILABLE",
        "refused after a search for its lines, before any parse (the same page again by its digest);"
        " UNAVAILABLE",
    ),
    Fault(
        "redirect",
        "HTTP 302 to a page with other values",
        "UNAVAILABLE",
        "redirect refused, naming the Location (never followed to another page or host); UNAVAILABLE",
    ),
    Fault(
        "not_an_exporter",
        "a valid page without any GPU exporter metrics (a wrong port, another program's /metrics)",
        "UNAVAILABLE",
        "failed source 'no GPU exporter metrics on this page', never an empty fleet read as 0; UNAVAILABLE",
    ),
    Fault(
        "escapes", "label values with escapes and unicode in other labels", 60.0, "parsed exactly: value 60"
    ),
    Fault(
        "restart",
        "exporter restarts between scrapes (down, then up again)",
        60.0,
        "UNAVAILABLE while down, value again after the restart",
    ),
)


# Faults of the other sources, each proven by the named test (a unit test checks the tests exist).
OTHER_FAULTS: tuple[tuple[str, str, str], ...] = (
    (
        "Prometheus down, slower than --prometheus-timeout, HTTP error, error status, not JSON, too large",
        "UNAVAILABLE naming the reason, from GetMetrics and IsActive",
        "test_prometheus.py::test_prometheus_down_slow_or_failing_is_unavailable, test_is_active_unavailable_too",
    ),
    (
        "a series whose sample stopped moving (stale in Prometheus)",
        "not used; its pods count as missing",
        "test_prometheus.py::test_series_with_frozen_timestamps_are_not_used, test_dead_exporter_pods_count_as_missing",
    ),
    (
        "a GPU exporter read through Prometheus stops (up 0) or loses its GPU series, for any length of time",
        "its pods keep counting as missing pods for as long as it lasts (they used to be forgotten after"
        " 5 minutes); once Prometheus drops the scrape target (its node gone) they stop counting",
        "test_prometheus_parts.py::test_a_vanished_exporter_is_decided_by_up_however_long_it_lasts",
    ),
    (
        "without Kubernetes, an inference server read through Prometheus stops (up 0) or its series freeze",
        "its pod still counts, as a missing pod (threshold, or UNAVAILABLE when fewer than half report),"
        " never the smaller sum; once Prometheus drops its scrape target (pod deleted) it stops counting",
        "test_prometheus_inference.py::test_a_stopped_server_is_a_missing_pod_until_prometheus_drops_its_target,"
        " test_series_with_frozen_timestamps_are_left_out",
    ),
    (
        "Prometheus refuses the credentials",
        "UNAVAILABLE naming HTTP 401",
        "test_prometheus.py::test_basic_auth_wrong_password_names_http_401",
    ),
    (
        "Kubernetes API server down",
        "UNAVAILABLE (never 0), recovers when it is back",
        "test_kubernetes.py::test_api_server_down_is_unavailable_never_zero_then_recovers",
    ),
    (
        "RBAC denies a call",
        "UNAVAILABLE naming the verb, resource and namespace to grant",
        "test_kubernetes.py::test_rbac_denied_names_the_missing_permission",
    ),
    (
        "a pending trigger's InferencePool does not exist (yet)",
        "UNAVAILABLE naming the pool; its queue is read once it is created, without a restart",
        "test_gateway_kubernetes.py::test_a_pool_created_later_is_read_without_a_restart",
    ),
    (
        "an InferencePool whose endpointPickerRef is not a Service, or no Ready endpoint picker pod",
        "UNAVAILABLE naming the kind, or the pool",
        "test_gateway_kubernetes.py::test_a_picker_that_is_not_a_service_is_unavailable_naming_its_kind,"
        " test_no_ready_picker_pod_is_unavailable_naming_the_pool",
    ),
    (
        "an endpoint picker answers 401 or 403",
        "UNAVAILABLE saying what is missing: TLS with --gateway-ca-file (the token goes over verified"
        " HTTPS only), or `get` on the non-resource URL /metrics",
        "test_gateway_kubernetes.py::test_a_picker_refusing_the_scaler_is_unavailable_saying_what_is_missing",
    ),
    (
        "an endpoint picker checks the token as llm-d's does by default (plain HTTP, --metrics-endpoint-auth)",
        "with --gateway-token-file (and --gateway-token-plain-http on) its page is read; without a token"
        " 401, with an identity lacking the grant 403: UNAVAILABLE naming the setting and the ClusterRole"
        " rule; the scaler's own token never goes over plain HTTP",
        "test_gateway_token.py::test_the_right_token_reads_the_page_over_plain_http_when_allowed,"
        " test_without_plain_http_allowed_no_token_goes_and_the_401_names_the_setting,"
        " test_a_token_without_the_grant_gets_a_403_naming_the_rbac",
    ),
    (
        "the --gateway-token-file token is missing, empty, unreadable, or rotated mid-run",
        "the page fails naming the flag and the file, never with a stale token; a rotated token is read on"
        " the next scrape",
        "test_gateway_token.py::test_a_token_file_that_cannot_be_read_fails_the_page_naming_the_flag_and_file,"
        " test_a_token_rotated_mid_run_is_read_again_and_a_removed_one_is_never_reused,"
        " test_the_scaler_wakes_through_an_authenticating_epp_and_follows_a_rotation",
    ),
    (
        "--gateway-token-file is one file where tenants place the pickers (Kubernetes), or a directory without"
        " a namespace's file",
        "one file is never sent there (a tenant's pod could obtain it and read other namespaces' pickers);"
        " each namespace's pickers get only the file named after it, and a namespace without one gets no"
        " token: its page fails naming the file to add",
        "test_gateway_token.py::test_a_directory_holds_one_token_per_namespace_and_each_namespace_gets_its_own,"
        " test_one_token_file_is_never_sent_where_tenants_place_the_pickers",
    ),
    (
        "the scaler starts with Kubernetes and --gateway-token-file naming one file",
        "it does not start, saying to give a directory of one token per namespace; given one, each"
        " namespace's pickers are read with their own token only",
        "test_gateway_token_minted.py::test_token_files_reach_each_namespaces_pickers_only_and_one_file_for_all_stops_start_up",
    ),
    (
        "--gateway-token-serviceaccount: the API server refuses to mint (403: no `create` on"
        " serviceaccounts/token; 404: no such ServiceAccount) or cannot be reached; tokens expire",
        "tokens are renewed in the background before they expire; a refusal fails the pages naming the flag"
        " and the Role rule (resourceNames) or the ServiceAccount to create, never another token; in an"
        " outage the last token is used until it expires, then the pages fail saying so",
        "test_gateway_token_minted.py::test_the_pool_is_read_through_minted_tokens_renewed_before_they_expire,"
        " test_a_scaler_without_the_grant_to_mint_fails_the_pool_naming_the_rbac_rule,"
        " test_a_service_account_that_does_not_exist_is_named_with_what_to_create,"
        " test_a_minting_outage_keeps_the_last_token_until_it_expires_then_fails_clearly",
    ),
    (
        "the endpoint picker turns requests away for want of an endpoint (RejectedNoEndpoints,"
        " EvictedNoEndpoints) before a scrape saw them queued",
        "active (a wake) while the replica's latest page shows those counters grew since its previous one;"
        " a counter that goes down is an EPP restart: a new baseline, no wake, no error",
        "test_gateway_wake_signals.py::test_requests_turned_away_wake_the_workload_until_a_page_shows_no_more,"
        " test_an_epp_restart_resets_its_counters_without_a_wake_or_an_error",
    ),
    (
        "a pending trigger's `model` matches no series of the pool",
        "INVALID_ARGUMENT naming the model shown when it differs only by case or blanks; else 0, with the"
        " models the pool has shown in /explain and one log line",
        "test_gateway_wake_signals.py::test_a_model_differing_only_by_case_is_invalid_argument_naming_the_model_seen,"
        " test_a_model_never_seen_reads_0_and_explain_lists_the_models_shown",
    ),
    (
        "an older endpoint picker (inference_extension_*) at rest with flow control on; queue series that"
        " differ only by a label the scaler does not know",
        '0, not "flow control off"; the series are summed (told apart by their whole label set)',
        "test_gateway_wake_signals.py::test_an_idle_older_epp_reads_0_and_sharded_series_are_summed",
    ),
    (
        "an endpoint picker replica's page fails or is stale (--gateway-url or discovered)",
        "GetMetrics: the others' sum when above 0 (a lower bound, in /explain), else UNAVAILABLE naming the"
        " pool and the failure; IsActive: true where the others are active, else UNAVAILABLE; never 0 or false."
        " Stale: older than 2 × --gateway-interval + --scrape-timeout (a replica answering in time never is)",
        "test_gateway.py::test_a_failing_replica_leaves_a_lower_bound_or_unavailable_never_zero,"
        " test_a_lower_bound_at_or_below_the_activation_threshold_is_the_value_and_activity_is_unknown,"
        " test_every_replica_failing_is_unavailable_naming_the_pool,"
        " test_a_replica_answering_within_the_scrape_timeout_is_never_stale",
    ),
    (
        "an endpoint picker with its flowControl feature gate off",
        "UNAVAILABLE telling to enable the EPP's flowControl feature gate",
        "test_gateway.py::test_flow_control_off_is_unavailable_telling_to_enable_it",
    ),
    (
        "a gateway page that is not an endpoint picker's, declares its queue as a counter, or holds a NaN"
        " or negative queue size",
        "that replica is unread (UNAVAILABLE with the reason, or a lower bound), never 0",
        "test_gateway.py::test_a_page_that_is_not_an_epps_is_unavailable,"
        " test_a_queue_of_the_wrong_type_is_unavailable_naming_it,"
        " test_nan_or_negative_sizes_are_unavailable_not_zero",
    ),
    (
        "a pending trigger names a pool of another namespace",
        "INVALID_ARGUMENT for a namespaced name; a bare name is read in the ScaledObject's own namespace only",
        "test_gateway.py::test_a_pool_of_another_namespace_is_never_read",
    ),
    (
        "an endpoint picker read through Prometheus stops (up 0)",
        "its replica counts as unread: a lower bound when the others hold requests, else UNAVAILABLE;"
        " never 0",
        "test_prometheus_gateway.py::test_a_replica_prometheus_cannot_scrape_is_never_read_as_zero",
    ),
    (
        "watch answered 410 Gone",
        "relist, then values follow again",
        "test_kubernetes.py::test_watch_410_gone_relists_and_recovers",
    ),
    (
        "every watch answered 410 Gone, even from a fresh list (a watch cache behind the lists)",
        "relists back off from 0.8 s doubling up to 30 s (as client-go does), values those of the last"
        " list meanwhile; no list storm",
        "test_kubernetes.py::test_a_watch_410_gone_right_after_every_list_backs_off",
    ),
    (
        "a healthy watch (an event or bookmark read, or open 5 s) drops, however often",
        "a first failure: watched again after 0.2 s, not after a wait doubled by the drops before",
        "test_kubernetes.py::test_a_healthy_watch_that_drops_reconnects_promptly_however_often_it_happened",
    ),
)


# What one tenant (a namespace's ScaledObjects and the sources they read) cannot do to another, and the
# bounds on what any caller can make the scaler hold; each proven by the named tests.
TENANT_PROPERTIES: tuple[tuple[str, str, str], ...] = (
    (
        "Collectors share their capacity fairly between namespaces: 300 endpoint-picker replicas of one"
        " tenant hang until the scrape timeout",
        "each namespace has 2 fetches in flight of its own that no other can take, and the common pool"
        " (--scrape-concurrency) on top, at most half of it while another namespace wants a slot; freed"
        " slots go to the waiting namespaces in turn. The"
        " healthy tenant's page is fetched on schedule while the 300 hang (its wake is measured in"
        " docs/SOAK.md); at most --scrape-concurrency + 2 × namespaces fetches run at once",
        "test_fair_collectors.py::test_a_healthy_tenants_page_is_fetched_while_300_replicas_of_another_hang",
    ),
    (
        "One tenant's pods serve six 15 MB pages of 20,000 series (each page over 256 kB is joined, screened"
        " and read in one of the two page worker threads: 1 s of parsing each)",
        "each namespace (and the pages of none: GPU exporters) runs one job in the worker threads at a"
        " time, the namespaces taken in turn: another tenant's GPU exporter page waits behind at most one"
        " job of each other namespace, and its data stay fresh (before, one queue for all: stale)",
        "test_fair_page_work.py::test_another_tenants_large_pages_never_make_the_gpu_exporter_stale,"
        " test_control_without_the_hostile_tenant_the_exporter_stays_fresh",
    ),
    (
        "A shared pod IP (hostNetwork pods share their node's): tenant B names tenant A's port as its"
        " metricsPort",
        "a page is filed under the pod that declares that container port at that address; claimed for several"
        " pods of which not exactly one declares it, it is read for none until a claim goes (B's pod is"
        " then missing, with a note saying why). Never read across namespaces, never bound to whoever"
        " named it last: A keeps its value",
        "test_shared_pod_ip.py::test_a_tenant_naming_anothers_port_neither_reads_its_load_nor_blinds_it",
    ),
    (
        "Numbers the wire cannot carry: `threshold: 1e19`; a page value of 1e19; two 1e308 summing to inf",
        "a threshold outside 0.001 ≤ threshold ≤ 1e15 (KEDA carries it as int64 milli-units) is"
        " INVALID_ARGUMENT naming it; a pod's (or endpoint-picker replica's) value beyond 1e15 or not"
        " finite, and a sum beyond it, are UNAVAILABLE naming the pod and family; never INTERNAL",
        "test_wire_numbers.py::test_a_threshold_beyond_what_keda_carries_is_invalid_argument,"
        " test_a_value_beyond_the_wire_is_unavailable_naming_the_pod_and_family,"
        " test_a_sum_that_is_not_finite_is_unavailable_naming_the_pod,"
        " test_engines_whose_sum_is_beyond_a_float_are_unavailable_naming_the_pod_and_family,"
        " test_pods_each_within_the_wire_whose_sum_is_not_are_unavailable,"
        " test_an_endpoint_picker_queue_beyond_the_wire_is_unavailable_naming_the_replica",
    ),
    (
        "A caller sends new metadata on every call (a new podNamePrefix each time), or many metric names"
        " per ScaledObject",
        "a ScaledObject remembers its 64 latest notes and logs at most 32 new ones while followed (one line"
        " then says the rest are in /explain); /metrics shows the value, activity and learned target of at"
        " most 4 triggers per ScaledObject (the rest counted in keda_gpu_scaler_triggers_unpublished_total):"
        " at most 12 × --max-scaledobjects labelled series",
        "test_growth_bounds.py::test_a_new_pod_name_prefix_on_every_call_keeps_notes_and_log_bounded,"
        " test_a_scaledobject_shows_a_bounded_number_of_triggers_on_metrics",
    ),
    (
        "A crowd of /explain clients",
        "at most 2 answers rendered at once and a budget of cost units (1 per request plus 1 per 100 pods"
        " listed; 100 a second, 200 at once): over either, 429 with Retry-After at once, before any work;"
        " gRPC calls go on",
        "test_explain_admission.py::test_a_crowd_of_explain_clients_gets_429_quickly_and_grpc_goes_on",
    ),
)


@functools.cache
def gzip_bomb() -> bytes:
    """200 MB of comment lines, gzip-compressed to about 400 kB (made once, when first served)."""
    return gzip.compress((b"# " + b"x" * 1021 + b"\n") * 200_000, compresslevel=9)


@functools.cache
def many_series() -> bytes:
    """21,000 short GPU series after the two healthy ones (made once, when first served)."""
    lines = [f'DCGM_FI_DEV_GPU_UTIL{{pod="o{i}"}} 5' for i in range(21_000)]
    return page(line("vllm-0", "30", 0), line("vllm-1", "30", 1), *lines).encode()


class FaultyExporter:
    """An aiohttp exporter on 127.0.0.1 that serves two healthy pods until told to misbehave."""

    def __init__(self) -> None:
        self.fault: str | None = None
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def healthy(self) -> str:
        return page(line("vllm-0", "30", 0), line("vllm-1", "30", 1))

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        fault = self.fault
        if fault == "slow":
            await asyncio.sleep(2)
        elif fault == "http_500":
            return web.Response(status=500, text="internal error")
        elif fault == "reset":
            response = web.StreamResponse(headers={"Content-Length": "100000"})
            await response.prepare(request)
            await response.write(self.healthy().encode()[:80])
            assert request.transport is not None
            request.transport.close()
            return response
        elif fault == "truncated":
            return web.Response(text=self.healthy()[:-30])
        elif fault == "garbage":
            return web.Response(body=bytes(range(256)) * 64)
        elif fault == "huge":
            response = web.StreamResponse()
            await response.prepare(request)
            chunk = ("# padding " + "x" * 1013 + "\n").encode() * 1024  # 1 MiB of comment lines
            for _ in range(100):
                await response.write(chunk)
            return response
        elif fault == "nan_inf":
            return web.Response(text=page(line("vllm-0", "NaN", 0), line("vllm-1", "+Inf", 1)))
        elif fault == "negative_huge":
            return web.Response(text=page(line("vllm-0", "-5", 0), line("vllm-1", "1e300", 1)))
        elif fault == "duplicates":
            lines = [line("vllm-0", "30", 0), line("vllm-1", "30", 1)]
            return web.Response(text=page(*lines, *lines))
        elif fault == "conflicting":
            lines = [line("vllm-0", "30", 0), line("vllm-1", "30", 1), line("vllm-0", "90", 0)]
            return web.Response(text=page(*lines))
        elif fault == "gzip_bomb":
            return web.Response(body=gzip_bomb(), headers={"Content-Encoding": "gzip"})
        elif fault == "gzip_cut":
            text = self.healthy().encode()
            cut = text.index(b'pod="vllm-1"} 30') + len(b'pod="vllm-1"} 3')
            compressor = zlib.compressobj(wbits=31)
            body = compressor.compress(text[:cut]) + compressor.flush(zlib.Z_SYNC_FLUSH)
            return web.Response(body=body, headers={"Content-Encoding": "gzip"})
        elif fault == "gzip_invalid":
            return web.Response(text=self.healthy(), headers={"Content-Encoding": "gzip"})
        elif fault == "many_series":
            return web.Response(body=many_series())
        elif fault == "redirect":
            raise web.HTTPFound("/elsewhere")
        elif fault == "not_an_exporter":
            return web.Response(
                text="# HELP process_cpu_seconds_total CPU.\nprocess_cpu_seconds_total 12.5\n"
            )
        elif fault == "escapes":
            tricky = 'modelName="H100 \\"SXM\\" \\\\ 80GB\\nπ✓"'
            lines = [line("vllm-0", "30", 0), line("vllm-1", "30", 1)]
            return web.Response(
                text=page(*(ln.replace('modelName="NVIDIA H100 80GB HBM3"', tricky) for ln in lines))
            )
        return web.Response(text=self.healthy())

    async def _elsewhere(self, _: web.Request) -> web.Response:
        # Where the redirect points: a page that would read 90 per pod if it were followed.
        return web.Response(text=page(line("vllm-0", "90", 0), line("vllm-1", "90", 1)))

    async def start(self, port: int = 0) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/elsewhere", self._elsewhere)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def reliability_markdown() -> str:
    rows = [
        "# Reliability: exporter faults and what the scaler does",
        "",
        "Each row is a case of `tests/integration/test_faults.py`, which injects the fault on a loopback",
        "exporter and checks the behaviour through the real gRPC API, while a second, healthy exporter",
        "serving another namespace keeps its exact value and the process keeps serving.",
        "This page is generated from the same table (`tests/faults.py`); a test keeps them in step.",
        "",
        "| fault | observed behaviour of the affected trigger |",
        "|---|---|",
    ]
    rows += [f"| {f.description} | {f.behaviour} |" for f in FAULTS]
    rows += [
        "",
        "Faults of the other sources (each proven by the named test in `tests/integration/`):",
        "",
        "| fault | observed behaviour | test |",
        "|---|---|---|",
    ]
    rows += [f"| {fault} | {behaviour} | `{tests}` |" for fault, behaviour, tests in OTHER_FAULTS]
    rows += [
        "",
        "## Tenants: what one cannot do to another, and what any caller can make the scaler hold",
        "",
        "Each proven by the named test in `tests/integration/` (through the real gRPC and HTTP servers).",
        "",
        "| attempt | what the scaler does | test |",
        "|---|---|---|",
    ]
    rows += [f"| {attempt} | {behaviour} | `{tests}` |" for attempt, behaviour, tests in TENANT_PROPERTIES]
    return "\n".join(rows) + "\n"
