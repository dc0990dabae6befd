"""gRPC over TLS and mTLS as KEDA connects: SAN checked against scalerAddress's host, client certs, renewal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from certs import CertificateAuthority, write

from keda_gpu_scaler.externalscaler import externalscaler_pb2 as pb
from keda_gpu_scaler.externalscaler import externalscaler_pb2_grpc as pb_grpc

HOST = "keda-gpu-scaler.keda"  # the host part of the ScaledObject's scalerAddress
REF = pb.ScaledObjectRef(
    name="vllm", namespace="llm", scalerMetadata={"podNamePrefix": "vllm-", "threshold": "70"}
)


async def call(port: int, ca: bytes, client: tuple[bytes, bytes] | None = None) -> pb.GetMetricSpecResponse:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=ca,
        private_key=client[1] if client else None,
        certificate_chain=client[0] if client else None,
    )
    # KEDA dials the Service name; here the name is pinned while the socket goes to loopback.
    options = [("grpc.ssl_target_name_override", HOST), ("grpc.default_authority", HOST)]
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials, options=options) as channel:
        return await pb_grpc.ExternalScalerStub(channel).GetMetricSpec(REF, timeout=5)


@pytest.fixture
def ca() -> CertificateAuthority:
    return CertificateAuthority()


async def test_tls_with_matching_san(make_scaler, ca: CertificateAuthority, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cert, key = write(tmp_path, "server", ca.issue(HOST, [HOST, f"{HOST}.svc"]))
    scaler = await make_scaler(tls_cert_file=cert, tls_key_file=key)
    response = await call(scaler.app.grpc_port, ca.cert_pem)
    assert response.metricSpecs[0].targetSizeFloat == 70


async def test_wrong_san_fails_as_keda_would_see_it(
    make_scaler, ca: CertificateAuthority, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    cert, key = write(tmp_path, "server", ca.issue("other", ["other.example"]))
    scaler = await make_scaler(tls_cert_file=cert, tls_key_file=key)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call(scaler.app.grpc_port, ca.cert_pem)
    assert raised.value.code() is grpc.StatusCode.UNAVAILABLE


async def test_untrusted_ca_fails(make_scaler, ca: CertificateAuthority, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cert, key = write(tmp_path, "server", ca.issue(HOST, [HOST]))
    scaler = await make_scaler(tls_cert_file=cert, tls_key_file=key)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call(scaler.app.grpc_port, CertificateAuthority("another CA").cert_pem)
    assert raised.value.code() is grpc.StatusCode.UNAVAILABLE


async def test_mtls_refuses_clients_without_a_trusted_certificate(
    make_scaler, ca: CertificateAuthority, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    cert, key = write(tmp_path, "server", ca.issue(HOST, [HOST]))
    client_ca = CertificateAuthority("client CA")
    (tmp_path / "client-ca.crt").write_bytes(client_ca.cert_pem)
    scaler = await make_scaler(
        tls_cert_file=cert, tls_key_file=key, tls_client_ca_file=tmp_path / "client-ca.crt"
    )
    port = scaler.app.grpc_port
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await call(port, ca.cert_pem)  # no client certificate
    assert raised.value.code() is grpc.StatusCode.UNAVAILABLE
    stranger = CertificateAuthority("stranger").issue("keda-operator", [], client=True)
    with pytest.raises(grpc.aio.AioRpcError):
        await call(port, ca.cert_pem, (stranger.cert_pem, stranger.key_pem))
    keda = client_ca.issue("keda-operator", [], client=True)
    response = await call(port, ca.cert_pem, (keda.cert_pem, keda.key_pem))
    assert response.metricSpecs[0].metricName == "gpu-utilization"


async def test_renewed_certificate_is_used_without_restart(
    make_scaler, ca: CertificateAuthority, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    old_ca = CertificateAuthority("old CA")
    cert, key = write(tmp_path, "server", old_ca.issue(HOST, [HOST]))
    scaler = await make_scaler(tls_cert_file=cert, tls_key_file=key)
    port = scaler.app.grpc_port
    await call(port, old_ca.cert_pem)
    with pytest.raises(grpc.aio.AioRpcError):
        await call(port, ca.cert_pem)
    renewed = ca.issue(HOST, [HOST])
    # Write new files and swap them in atomically, as a Secret volume update does.
    new_cert, new_key = write(tmp_path, "renewed", renewed)
    os.replace(new_key, key)
    os.replace(new_cert, cert)
    response = await call(port, ca.cert_pem)
    assert response.metricSpecs[0].targetSizeFloat == 70
    assert scaler.app.tls is not None and scaler.app.tls.reloads == 1


@pytest.mark.parametrize("case", ["not PEM", "a key of another certificate"])
def test_a_certificate_tls_cannot_use_is_named_not_the_grpc_port(tmp_path: Path, case: str) -> None:
    if case == "not PEM":
        cert = key = tmp_path / "bad.pem"
        cert.write_text("not a certificate\n")
    else:
        ca = CertificateAuthority()
        cert, _ = write(tmp_path, "a", ca.issue("scaler", ["localhost"]))
        _, key = write(tmp_path, "b", ca.issue("other", ["localhost"]))
    flags = ["--tls-cert-file", str(cert), "--tls-key-file", str(key), "--kubernetes", "off"]
    flags += ["--grpc-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0"]
    done = subprocess.run(
        [sys.executable, "-m", "keda_gpu_scaler", "serve", *flags], capture_output=True, text=True, timeout=60
    )
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2 and "--tls-cert-file" in last and "port is in use" not in last, done.stderr[
        -500:
    ]
