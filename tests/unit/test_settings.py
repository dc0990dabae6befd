"""Settings built from flag values: defaults derived from other flags, and clear errors."""

from __future__ import annotations

import re
from typing import Any

import pytest

from keda_gpu_scaler.config.settings import SettingsError, build_settings, env_values

PROM = "http://prometheus:9090"


def test_staleness_defaults_follow_the_scrape_interval() -> None:
    default = build_settings({})
    assert (default.max_staleness, default.prometheus_max_staleness) == (15.0, 75.0)
    faster = build_settings({"scrape_interval": "2"})
    assert (faster.max_staleness, faster.prometheus_max_staleness) == (
        7.0,
        67.0,
    )  # 2 intervals + the 3 s timeout
    slow = build_settings({"scrape_interval": "2", "scrape_timeout": "1"})
    assert slow.max_staleness == 6.0
    explicit = build_settings(
        {"max_staleness": "9", "prometheus_max_staleness": "120", "prometheus_url": PROM}
    )
    assert (explicit.max_staleness, explicit.prometheus_max_staleness) == (9.0, 120.0)


@pytest.mark.parametrize("flag", ["max_staleness", "prometheus_max_staleness", "scrape_interval"])
def test_bad_durations_name_the_flag(flag: str) -> None:
    with pytest.raises(SettingsError, match=f"--{flag.replace('_', '-')}='-1'"):
        build_settings({flag: "-1"})


@pytest.mark.parametrize(
    ("flag", "raw", "words"),
    [
        ("scrape_interval", "５", "is not a number"),  # a full-width digit
        ("max_scaledobjects", "٥٠٠٠", "is not an integer"),  # Arabic-Indic digits
        ("interest_ttl", "6_00", "is not a number"),
        ("scrape_timeout", " 3\n", "is not a number"),
        ("max_scaledobjects", "5e3", "is not an integer"),
    ],
)
def test_a_number_flag_takes_ascii_decimals_only_as_metadata_does(flag: str, raw: str, words: str) -> None:
    # int() and float() take these; metadata and the one-shot commands refuse them.
    with pytest.raises(SettingsError, match=words):
        build_settings({flag: raw})


@pytest.mark.parametrize(
    ("values", "words"),
    [
        (
            {"kubernetes": "on", "inference_url": ["llm/vllm-0=http://10.0.0.5:8000/metrics"]},
            "--inference-url is read without Kubernetes only (--kubernetes on)",
        ),
        (
            {"kubernetes": "off", "kubeconfig": "/etc/kube/config"},
            "--kubeconfig is read with Kubernetes only",
        ),
    ],
)
def test_a_flag_its_kubernetes_mode_never_reads_is_refused_naming_both(
    values: dict[str, Any], words: str
) -> None:
    # Both started, and the flag was silently ignored.
    with pytest.raises(SettingsError, match=re.escape(words)):
        build_settings(values)


@pytest.mark.parametrize("flag", ["keepalive_time", "keepalive_timeout"])
@pytest.mark.parametrize("value", ["3000000", "1e306", "0.0001"])
def test_a_keepalive_grpc_cannot_take_is_refused_naming_the_flag(flag: str, value: str) -> None:
    # gRPC takes milliseconds as a C int: beyond 2147483 s serve ended in an OverflowError traceback.
    with pytest.raises(SettingsError) as raised:
        build_settings({flag: value})
    name = f"--{flag.replace('_', '-')}"
    assert f"{name}={value!r} is out of range" in str(raised.value)
    assert f"0.001 <= {name} <= 2147483" in str(raised.value)
    assert build_settings({flag: "2147483"}) is not None


@pytest.mark.parametrize("address", ["127.0.0.1:٦٠٠٠", "[::1]:６０００", "0.0.0.0:6000²"])
def test_a_port_in_other_than_ascii_digits_is_not_an_address(address: str) -> None:
    # isdigit() takes them (int() some), but gRPC cannot parse them: it read as "port in use".
    with pytest.raises(SettingsError, match="is not an address; allowed: HOST:PORT"):
        build_settings({"grpc_address": address})


def test_defaults_of_code_flags_and_environment_agree() -> None:
    # Settings() (what code and tests build) equals what an empty command line and environment give.
    from keda_gpu_scaler.config.settings import Settings, env_values

    assert build_settings({}) == Settings()
    assert build_settings(env_values({})) == Settings()


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("KEDA_GPU_SCALER_KUBERNETES", "yes"),
        ("KEDA_GPU_SCALER_KUBERNETES", "true"),
        ("KEDA_GPU_SCALER_KUBERNETES", "ON"),
        ("KEDA_GPU_SCALER_LOG_LEVEL", "verbose"),
        ("KEDA_GPU_SCALER_LOG_FORMAT", "xml"),
        ("KEDA_GPU_SCALER_DEFAULT_SOURCE", "both"),
        ("KEDA_GPU_SCALER_EXPLAIN", "true"),
    ],
)
def test_environment_values_of_choice_flags_are_checked_like_flags(variable: str, value: str) -> None:
    from keda_gpu_scaler.config.settings import env_values

    with pytest.raises(SettingsError, match=rf"{value!r} is not allowed; use one of"):
        build_settings(env_values({variable: value}))


def test_every_flag_has_a_parser_and_a_settings_field() -> None:
    import dataclasses

    from keda_gpu_scaler.config.flags import FLAGS
    from keda_gpu_scaler.config.settings import Settings

    fields = {f.name for f in dataclasses.fields(Settings)}
    for flag in FLAGS:
        assert flag.settings_field in fields, flag.name
        flag.typed_default  # noqa: B018 - parsing the default must not fail


def test_inference_urls_name_the_pod_each_page_belongs_to() -> None:
    settings = build_settings(
        {"inference_url": ["llm/vllm-0=http://10.0.0.5:8000/metrics, llm/vllm-1=http://h:1/m"]}
    )
    assert settings.inference_urls == (
        ("llm", "vllm-0", "http://10.0.0.5:8000/metrics"),
        ("llm", "vllm-1", "http://h:1/m"),
    )
    for bad in ("vllm-0=http://h/m", "llm/vllm-0", "LLM/x=http://h/m", "llm/x=ftp://h/m"):
        with pytest.raises(SettingsError, match="--inference-url"):
            build_settings({"inference_url": [bad]})


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"scrape_interval": "10", "max_staleness": "5"}, ["--max-staleness=5", "--scrape-interval=10"]),
        (
            {"scrape_interval": "10", "prometheus_max_staleness": "8", "prometheus_url": PROM},
            ["--prometheus-max-staleness=8", "--scrape-interval=10"],
        ),
        ({"scrape_interval": "700"}, ["--scrape-interval='700'", "0.1", "300"]),
        ({"scrape_interval": "1e-300"}, ["--scrape-interval='1e-300'", "0.1", "300"]),
    ],
)
def test_intervals_that_could_never_give_fresh_data_are_refused_naming_both_flags(
    values: dict[str, str], named: list[str]
) -> None:
    # Data older than --max-staleness is never used: at or under the scrape interval every page is
    # stale before the next one comes. Past 300 s no `demand` window (at most 600 s) holds two scrapes;
    # under 0.1 s the scrape loop spins.
    with pytest.raises(SettingsError) as raised:
        build_settings(values)
    for text in named:
        assert text in str(raised.value), raised.value


@pytest.mark.parametrize("value", ["1e9", "301"])
def test_a_scrape_timeout_that_would_keep_a_hung_exporters_page_is_refused(value: str) -> None:
    # The default staleness allows for the timeout: 1e9 s kept a hung exporter's last page in use for ever.
    with pytest.raises(SettingsError) as raised:
        build_settings({"scrape_timeout": value})
    assert f"--scrape-timeout={value!r} is out of range" in str(raised.value)
    assert "at most 300" in str(raised.value)
    assert build_settings({"scrape_timeout": "300"}).scrape_timeout == 300.0


@pytest.mark.parametrize(
    ("values", "flag"),
    [
        ({"exporter_url": ["http:///metrics"]}, "--exporter-url"),
        ({"exporter_url": ["http://"]}, "--exporter-url"),
        ({"inference_url": ["llm/vllm-0=http://"]}, "--inference-url"),
        ({"gateway_url": ["llm/chat=https:///metrics"]}, "--gateway-url"),
    ],
)
def test_a_page_url_without_a_host_is_refused_naming_the_flag(
    values: dict[str, list[str]], flag: str
) -> None:
    # Accepted, every scrape of it failed at run time (--prometheus-url already refused one).
    with pytest.raises(SettingsError, match=f"{flag}.*is not an http\\(s\\) URL"):
        build_settings(values)


def test_prometheus_max_staleness_needs_prometheus_url_as_its_siblings() -> None:
    with pytest.raises(SettingsError, match="--prometheus-max-staleness needs --prometheus-url"):
        build_settings({"prometheus_max_staleness": "120"})
    with pytest.raises(SettingsError, match="--prometheus-max-staleness needs --prometheus-url"):
        build_settings(env_values({"KEDA_GPU_SCALER_PROMETHEUS_MAX_STALENESS": "120"}))
    assert build_settings({"prometheus_url": "http://prometheus:9090", "prometheus_max_staleness": "120"})


@pytest.mark.parametrize("value", ["1e-6", "0.001", "301"])
def test_a_gateway_interval_is_refused_where_the_scrape_loop_would_spin(value: str) -> None:
    # 1e-6 fetched one endpoint picker's page about 6,000 times a second.
    with pytest.raises(
        SettingsError, match=f"--gateway-interval={value!r} is out of range; allowed: .*0.1 to 300"
    ):
        build_settings({"gateway_interval": value})


@pytest.mark.parametrize("value", ["1e-6", "0.001", "3601"])
def test_a_discovery_interval_is_refused_where_its_loop_would_spin_against_the_api_server(value: str) -> None:
    # 1e-6 read one ScaledObject's /scale 2,347 times a second from the API server.
    with pytest.raises(
        SettingsError, match=f"--discovery-interval={value!r} is out of range; allowed: seconds, 0.1 to 3600"
    ):
        build_settings({"discovery_interval": value})


@pytest.mark.parametrize(
    "line", ["X-Api-Key s3cr3t-api-key-0123", "Authorization Bearer s3cr3t-api-key-0123"]
)
def test_a_prometheus_header_without_a_colon_is_refused_without_echoing_its_secret(line: str) -> None:
    # Quoted whole up to 40 characters, the error (and the log it goes to) carried the key's start.
    with pytest.raises(SettingsError, match="not `Name: value`") as refused:
        build_settings({"prometheus_url": PROM, "prometheus_header": [line]})
    assert "s3cr3t" not in str(refused.value), refused.value


@pytest.mark.parametrize(
    ("values", "shown"),
    [
        ({"exporter_url": ["http://[fd00::7:9400/metrics"]}, "--exporter-url='http://[fd00::7:9400/metrics'"),
        (
            {"exporter_url": ["http://127.0.0.1:99999/metrics"]},
            "--exporter-url='http://127.0.0.1:99999/metrics'",
        ),
        ({"inference_url": ["llm/chat-0=http://[::1/metrics"]}, "'http://[::1/metrics'"),
        ({"gateway_url": ["llm/pool=http://[::1:9090/metrics"]}, "'http://[::1:9090/metrics'"),
        ({"prometheus_url": "http://[::1:9090"}, "--prometheus-url='http://[::1:9090'"),
    ],
)
def test_a_url_with_an_unclosed_bracket_or_a_port_out_of_range_is_refused_naming_it(
    values: dict[str, Any], shown: str
) -> None:
    # An unclosed IPv6 bracket ended serve and explain in a traceback; port 99999 failed at every read.
    with pytest.raises(SettingsError, match="is not an http\\(s\\) URL") as refused:
        build_settings(values)
    assert shown in str(refused.value)
