"""A trigger whose selection matches nothing while the data shows what it probably meant is an error
naming what exists, never a 0; a target legitimately at zero keeps its SPEC answer (docs/reference.md)."""

from __future__ import annotations

import grpc
import pytest
from support import GpuLine, dcgm_page, eventually

from keda_gpu_scaler.demo.engines import EngineLoad, vllm_page
from keda_gpu_scaler.demo.epp import Queued, epp_page
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb

NAMES = {"requests": "inference-requests", "queue": "inference-queue", "kv_cache": "kv-cache"}


def ref(metadata: dict[str, str], namespace: str = "llm") -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name="chat", namespace=namespace, scalerMetadata=metadata)


async def answer(
    scaler, metadata: dict[str, str], metric: str, namespace: str = "llm"
) -> tuple[grpc.StatusCode, str, float]:  # type: ignore[no-untyped-def]
    """(status, details, value) of one GetMetrics call."""
    request = pb.GetMetricsRequest(scaledObjectRef=ref(metadata, namespace), metricName=metric)
    try:
        response = await scaler.stub.GetMetrics(request)
    except grpc.aio.AioRpcError as error:
        return error.code(), error.details() or "", float("nan")
    return grpc.StatusCode.OK, "", response.metricValues[0].metricValueFloat


async def settled(
    scaler, metadata: dict[str, str], metric: str, namespace: str = "llm"
) -> tuple[grpc.StatusCode, str, float]:  # type: ignore[no-untyped-def]
    """The answer once the pages are read (before that: "no data yet")."""
    found: list[tuple[grpc.StatusCode, str, float]] = []

    async def read() -> None:
        found.append(await answer(scaler, metadata, metric, namespace))
        assert "not scraped yet" not in found[-1][1] and "no data yet" not in found[-1][1], found[-1]

    await eventually(read)
    return found[-1]


async def chat_pages(make_exporter, model: str = "llama") -> tuple[tuple[str, str, str], ...]:  # type: ignore[no-untyped-def]
    servers = [await make_exporter(vllm_page(model, [EngineLoad(3, 1, 0.2)])) for _ in range(2)]
    return tuple(("llm", f"vllm-chat-{index}", server.url) for index, server in enumerate(servers))


async def test_a_pod_name_prefix_close_to_the_pods_read_is_unavailable_naming_them(
    make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    scaler = await make_scaler(inference_urls=await chat_pages(make_exporter))
    typo = {"metric": "requests", "threshold": "8", "podNamePrefix": "vllm-chta-"}
    code, message, _ = await settled(scaler, typo, "inference-requests")
    assert code is grpc.StatusCode.UNAVAILABLE, message
    assert "vllm-chta-" in message and "vllm-chat-0" in message, message
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await scaler.stub.IsActive(ref(typo))
    assert raised.value.code() is grpc.StatusCode.UNAVAILABLE
    # A prefix unlike any pod read is a workload at zero: 0 and inactive (SPEC §4).
    other = {**typo, "podNamePrefix": "sglang-code-"}
    assert await settled(scaler, other, "inference-requests") == (grpc.StatusCode.OK, "", 0)


async def test_a_gpu_workload_whose_namespace_has_no_page_is_at_zero(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    exporter = await make_exporter(dcgm_page([GpuLine("llm", "vllm-chat-0", 70)]))
    scaler = await make_scaler(exporter)
    typo = {"podNamePrefix": "vllm-chta-", "threshold": "60"}
    code, message, _ = await settled(scaler, typo, "gpu-utilization")
    assert code is grpc.StatusCode.UNAVAILABLE and "vllm-chat-0" in message, message
    # The same prefix in a namespace no page names: the target is at zero, not a typo.
    at_zero = await settled(scaler, typo, "gpu-utilization", namespace="batch")
    assert at_zero == (grpc.StatusCode.OK, "", 0)


@pytest.mark.parametrize(
    ("typo", "pod"),
    [
        ("vlm-", "vllm-0"),
        ("tgl-", "tgi-0"),
        ("vllm-chta-", "vllm-chat-0"),
        ("tggi", "tgi-0"),
        ("xtgi", "tgi-0"),
    ],
)
async def test_a_short_prefix_one_letter_off_is_a_typo_not_a_workload_at_zero(
    make_exporter, make_scaler, typo: str, pod: str
) -> None:  # type: ignore[no-untyped-def]
    # `vlm-` for vllm-0..3 at 90 % each read 0 (a similarity ratio let short prefixes through).
    lines = [GpuLine("llm", f"{pod[:-1]}{i}", 90, gpu=i) for i in range(4)]
    scaler = await make_scaler(await make_exporter(dcgm_page(lines)))
    code, message, _ = await settled(scaler, {"podNamePrefix": typo, "threshold": "70"}, "gpu-utilization")
    assert code is grpc.StatusCode.UNAVAILABLE and pod in message, message
    far = await settled(scaler, {"podNamePrefix": "sglang-", "threshold": "70"}, "gpu-utilization")
    assert far == (grpc.StatusCode.OK, "", 0)


@pytest.mark.parametrize("prefix", ["x", "db"])
async def test_a_prefix_of_one_or_two_letters_unlike_every_pod_is_a_workload_at_zero(
    make_exporter, make_scaler, prefix: str
) -> None:  # type: ignore[no-untyped-def]
    # Any one letter is one change from any other: `x` (and `db`, by its `d`) was "close to deepseek-0".
    lines = [GpuLine("llm", name, 90, gpu=i) for i, name in enumerate(("deepseek-0", "vllm-0"))]
    scaler = await make_scaler(await make_exporter(dcgm_page(lines)))
    answer = await settled(scaler, {"podNamePrefix": prefix, "threshold": "70"}, "gpu-utilization")
    assert answer == (grpc.StatusCode.OK, "", 0)


@pytest.mark.parametrize("metric", sorted(NAMES))
async def test_a_model_named_in_the_wrong_case_is_invalid_for_every_metric(
    make_exporter, make_scaler, metric: str
) -> None:  # type: ignore[no-untyped-def]
    scaler = await make_scaler(inference_urls=await chat_pages(make_exporter, "Qwen/Qwen2-7B"))
    wrong = {"metric": metric, "threshold": "8", "podNamePrefix": "vllm-chat-", "model": "qwen/qwen2-7b"}

    async def invalid() -> None:
        code, message, _ = await answer(scaler, wrong, NAMES[metric])
        assert code is grpc.StatusCode.INVALID_ARGUMENT, message
        assert "qwen/qwen2-7b" in message and "Qwen/Qwen2-7B" in message, message

    await eventually(invalid)


async def test_a_pending_pool_matching_no_configured_pool_names_those_configured(
    make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    epp = await make_exporter(epp_page("chat-pool", {Queued("llama"): 2}))
    scaler = await make_scaler(gateway_urls=(("llm", "chat-pool", epp.url),))
    typo = {"metric": "pending", "threshold": "4", "inferencePool": "chat-pol"}
    code, message, _ = await answer(scaler, typo, "gateway-pending")
    assert code is grpc.StatusCode.UNAVAILABLE, message
    assert "chat-pol " in message and "chat-pool" in message, message
