"""One module parses single values for metadata and flags alike; each caller's refusal makes its own error."""

from __future__ import annotations

import pytest

from keda_gpu_scaler.core.errors import ConfigError
from keda_gpu_scaler.core.value_parsers import SettingsError, one_of, refuse_flag, refuse_metadata


def test_one_parser_refuses_with_each_callers_error_and_wording() -> None:
    with pytest.raises(ConfigError, match=r"^metadata engine='x' is not allowed; use one of: vllm, sglang$"):
        one_of("engine", "x", ("vllm", "sglang"), refuse_metadata)
    with pytest.raises(SettingsError, match=r"^--kubernetes='x' is not allowed; use one of: on, off$"):
        one_of("--kubernetes", "x", ("on", "off"), refuse_flag)
    assert one_of("engine", "vllm", ("vllm",), refuse_metadata) == "vllm"
