"""The gateway flags (SPEC §2, §7): --gateway-url, --gateway-interval, --gateway-ca-file."""

from __future__ import annotations

from pathlib import Path

import pytest

from keda_gpu_scaler.config.settings import SettingsError, build_settings, env_values


def test_gateway_urls_name_the_pool_each_replica_page_serves() -> None:
    settings = build_settings(
        {
            "gateway_url": [
                "llm/chat-pool=http://10.0.0.7:9090/metrics,llm/chat-pool=https://10.0.0.8:9090/metrics"
            ]
        }
    )
    assert settings.gateway_urls == (
        ("llm", "chat-pool", "http://10.0.0.7:9090/metrics"),
        ("llm", "chat-pool", "https://10.0.0.8:9090/metrics"),
    )
    assert (settings.gateway_interval, settings.gateway_ca_file) == (1.0, None)


def test_from_the_environment_comma_separated(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    values = env_values(
        {
            "KEDA_GPU_SCALER_GATEWAY_URL": "llm/a=http://h:9090/metrics,team/b=http://g:9090/metrics",
            "KEDA_GPU_SCALER_GATEWAY_INTERVAL": "0.5",
            "KEDA_GPU_SCALER_GATEWAY_CA_FILE": str(ca),
        }
    )
    settings = build_settings(values)
    assert [pool for _, pool, _ in settings.gateway_urls] == ["a", "b"]
    assert (settings.gateway_interval, settings.gateway_ca_file) == (0.5, ca)


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ("chat-pool=http://h/m", "NAMESPACE/POOL=URL"),
        ("llm/chat-pool", "NAMESPACE/POOL=URL"),
        ("LLM/chat-pool=http://h/m", "not a namespace name"),
        ("llm/Chat_Pool=http://h/m", "not an InferencePool name"),
        ("llm/chat-pool=ftp://h/m", "not an http(s) URL"),
        ("llm/a=http://h/m,llm/b=http://h/m", "two pools"),
    ],
)
def test_bad_gateway_urls_name_the_flag_and_the_value(bad: str, words: str) -> None:
    with pytest.raises(SettingsError, match="--gateway-url") as caught:
        build_settings({"gateway_url": [bad]})
    assert words in str(caught.value)


@pytest.mark.parametrize("bad", ["0", "-1", "soon"])
def test_gateway_interval_must_be_a_positive_number(bad: str) -> None:
    with pytest.raises(SettingsError, match="--gateway-interval"):
        build_settings({"gateway_interval": bad})


def test_the_service_account_whose_tokens_are_minted_is_namespace_slash_name() -> None:
    settings = build_settings({"gateway_token_serviceaccount": "keda/epp-metrics"})
    assert settings.gateway_token_serviceaccount == ("keda", "epp-metrics")
    assert build_settings({}).gateway_token_serviceaccount is None
    values = env_values({"KEDA_GPU_SCALER_GATEWAY_TOKEN_SERVICEACCOUNT": "keda/epp-metrics"})
    assert build_settings(values).gateway_token_serviceaccount == ("keda", "epp-metrics")
    for bad, words in (
        ("epp-metrics", "is not NAMESPACE/NAME"),
        ("Keda/epp-metrics", "'Keda' is not a namespace name"),
        ("keda/EPP_metrics", "'EPP_metrics' is not a ServiceAccount name"),
    ):
        with pytest.raises(SettingsError, match=f"--gateway-token-serviceaccount='{bad}'") as caught:
            build_settings({"gateway_token_serviceaccount": bad})
        assert words in str(caught.value)


def test_minted_tokens_exclude_the_token_file_and_need_kubernetes() -> None:
    with pytest.raises(SettingsError) as caught:
        build_settings({"gateway_token_serviceaccount": "keda/epp-metrics", "gateway_token_file": "/token"})
    assert "--gateway-token-file or --gateway-token-serviceaccount, not both" in str(caught.value)
    with pytest.raises(SettingsError, match="--gateway-token-serviceaccount needs Kubernetes"):
        build_settings({"gateway_token_serviceaccount": "keda/epp-metrics", "kubernetes": "off"})
    settings = build_settings({"gateway_token_serviceaccount": "keda/a", "gateway_token_plain_http": "on"})
    assert settings.gateway_token_plain_http
