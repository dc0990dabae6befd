"""Settings built from flag values: defaults derived from other flags, and clear errors."""

from __future__ import annotations

import pytest

from keda_gpu_scaler.settings import SettingsError, build_settings


def test_staleness_defaults_follow_the_scrape_interval() -> None:
    default = build_settings({})
    assert (default.max_staleness, default.prometheus_max_staleness) == (15.0, 75.0)
    faster = build_settings({"scrape_interval": "2"})
    assert (faster.max_staleness, faster.prometheus_max_staleness) == (6.0, 66.0)
    explicit = build_settings({"max_staleness": "9", "prometheus_max_staleness": "120"})
    assert (explicit.max_staleness, explicit.prometheus_max_staleness) == (9.0, 120.0)


@pytest.mark.parametrize("flag", ["max_staleness", "prometheus_max_staleness", "scrape_interval"])
def test_bad_durations_name_the_flag(flag: str) -> None:
    with pytest.raises(SettingsError, match=f"--{flag.replace('_', '-')}='-1'"):
        build_settings({flag: "-1"})
