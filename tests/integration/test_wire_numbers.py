"""Numbers the wire cannot carry, end to end through the real gRPC server: never INTERNAL."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor
from support import eventually

from keda_gpu_scaler.demo.engines import EngineLoad, vllm_page
from keda_gpu_scaler.demo.epp import Queued, epp_page
from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb

REQUESTS = {"metric": "requests", "threshold": "8", "podNamePrefix": "chat-"}
PENDING = {"metric": "pending", "threshold": "4", "inferencePool": "chat-pool"}


def ref(metadata: dict[str, str]) -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(name="chat", namespace="llm", scalerMetadata=metadata)


async def error_of(call) -> tuple[grpc.StatusCode, str]:  # type: ignore[no-untyped-def]
    try:
        await call
    except grpc.aio.AioRpcError as error:
        return error.code(), error.details() or ""
    return grpc.StatusCode.OK, ""


async def test_a_threshold_beyond_what_keda_carries_is_invalid_argument(make_scaler) -> None:  # type: ignore[no-untyped-def]
    scaler = await make_scaler()
    code, message = await error_of(scaler.stub.GetMetricSpec(ref({**REQUESTS, "threshold": "1e19"})))
    assert code is grpc.StatusCode.INVALID_ARGUMENT, (code, message)
    assert "threshold='1e19'" in message and "1e+15" in message, message
    # The largest threshold allowed is carried whole.
    spec = await scaler.stub.GetMetricSpec(ref({**REQUESTS, "threshold": "1e15"}))
    assert spec.metricSpecs[0].targetSize == 10**15


async def unavailable_naming(scaler, metadata: dict[str, str], metric: str, *words: str) -> None:  # type: ignore[no-untyped-def]
    request = pb.GetMetricsRequest(scaledObjectRef=ref(metadata), metricName=metric)

    async def check() -> None:
        for call in (scaler.stub.GetMetrics(request), scaler.stub.IsActive(ref(metadata))):
            code, message = await error_of(call)
            assert code is grpc.StatusCode.UNAVAILABLE, (code, message)
            for word in words:
                assert word in message, message

    await eventually(check)


async def test_a_value_beyond_the_wire_is_unavailable_naming_the_pod_and_family(
    make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    huge = await make_exporter(vllm_page("llama", [EngineLoad(1, 1e19, 0.5)]))
    scaler = await make_scaler(inference_urls=(("llm", "chat-0", huge.url),))
    await unavailable_naming(scaler, REQUESTS, "inference-requests", "pod chat-0 (vllm metrics)", "1e+19")


async def test_a_sum_that_is_not_finite_is_unavailable_naming_the_pod(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    # Running and waiting of 1e308 each: their sum is inf.
    inf = await make_exporter(vllm_page("llama", [EngineLoad(1e308, 1e308, 0.5)]))
    scaler = await make_scaler(inference_urls=(("llm", "chat-0", inf.url),))
    await unavailable_naming(scaler, REQUESTS, "inference-requests", "pod chat-0 (vllm metrics) gives inf")


# Two data-parallel engines each at a finite 1e308: their per-pod sum is beyond a float (math.fsum raises).
TWO_ENGINES_AT_1E308 = (
    'vllm:num_requests_running{engine="0",model_name="m"} 1e308\n'
    'vllm:num_requests_running{engine="1",model_name="m"} 1e308\n'
    'vllm:num_requests_waiting{engine="0",model_name="m"} 0\n'
    'vllm:num_requests_waiting{engine="1",model_name="m"} 0\n'
    'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 5\n'
    'vllm:request_success_total{engine="1",finished_reason="stop",model_name="m"} 5\n'
)


@pytest.mark.parametrize(
    ("metadata", "metric"),
    [
        (REQUESTS, "inference-requests"),
        ({**REQUESTS, "metric": "demand", "window": "10"}, "inference-demand"),
    ],
)
async def test_engines_whose_sum_is_beyond_a_float_are_unavailable_naming_the_pod_and_family(
    make_exporter, make_scaler, metadata: dict[str, str], metric: str
) -> None:  # type: ignore[no-untyped-def]
    page = await make_exporter(TWO_ENGINES_AT_1E308)
    scaler = await make_scaler(inference_urls=(("llm", "chat-0", page.url),))
    await unavailable_naming(scaler, metadata, metric, "chat-0", "vllm:num_requests_running")


async def test_pods_each_within_the_wire_whose_sum_is_not_are_unavailable(make_exporter, make_scaler) -> None:  # type: ignore[no-untyped-def]
    pages = [await make_exporter(vllm_page("llama", [EngineLoad(0, 9e14, 0.5)])) for _ in range(2)]
    scaler = await make_scaler(inference_urls=tuple(("llm", f"chat-{i}", p.url) for i, p in enumerate(pages)))
    await unavailable_naming(scaler, REQUESTS, "inference-requests", "summed over the pods", "pod chat-0")


async def test_an_endpoint_picker_queue_beyond_the_wire_is_unavailable_naming_the_replica(
    make_exporter, make_scaler
) -> None:  # type: ignore[no-untyped-def]
    queue = {Queued("a", fairness_id="x"): 1e308, Queued("a", fairness_id="y"): 1e308}
    epp = await make_exporter(epp_page("chat-pool", queue))
    scaler = await make_scaler(gateway_urls=(("llm", "chat-pool", epp.url),))
    await unavailable_naming(scaler, PENDING, "gateway-pending", "(epp metrics)", "inf")


# KEDA v2.21's externalscaler.proto (reference/keda-protocol.md): message → (field, type, number).
WIRE_FIELDS = {
    "ScaledObjectRef": {("name", "string", 1), ("namespace", "string", 2), ("scalerMetadata", "map", 3)},
    "IsActiveResponse": {("result", "bool", 1)},
    "GetMetricSpecResponse": {("metricSpecs", "MetricSpec", 1)},
    "MetricSpec": {("metricName", "string", 1), ("targetSize", "int64", 2), ("targetSizeFloat", "double", 3)},
    "GetMetricsRequest": {("scaledObjectRef", "ScaledObjectRef", 1), ("metricName", "string", 2)},
    "GetMetricsResponse": {("metricValues", "MetricValue", 1)},
    "MetricValue": {
        ("metricName", "string", 1),
        ("metricValue", "int64", 2),
        ("metricValueFloat", "double", 3),
    },
}
# method → (request, response, server streaming)
WIRE_METHODS = {
    "IsActive": ("ScaledObjectRef", "IsActiveResponse", False),
    "StreamIsActive": ("ScaledObjectRef", "IsActiveResponse", True),
    "GetMetricSpec": ("ScaledObjectRef", "GetMetricSpecResponse", False),
    "GetMetrics": ("GetMetricsRequest", "GetMetricsResponse", False),
    "StreamMetricSpec": ("ScaledObjectRef", "GetMetricSpecResponse", True),
}
_SCALAR = {
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_INT64: "int64",
    FieldDescriptor.TYPE_DOUBLE: "double",
}


def _wire_type(field: FieldDescriptor) -> str:
    if field.message_type is None:
        return _SCALAR[field.type]
    return "map" if field.message_type.GetOptions().map_entry else field.message_type.name


def test_the_proto_is_keda_v2_21s_field_for_field() -> None:
    assert pb.DESCRIPTOR.package == "externalscaler"
    fields = {
        name: {(f.name, _wire_type(f), f.number) for f in message.fields}
        for name, message in pb.DESCRIPTOR.message_types_by_name.items()
    }
    assert fields == WIRE_FIELDS
    service = pb.DESCRIPTOR.services_by_name["ExternalScaler"]
    methods = {
        m.name: (m.input_type.name, m.output_type.name, m.server_streaming and not m.client_streaming)
        for m in service.methods
    }
    assert methods == WIRE_METHODS
