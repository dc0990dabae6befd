"""gRPC server TLS/mTLS credentials whose certificate files are re-read when they are renewed."""

from __future__ import annotations

import logging
from pathlib import Path

import grpc

from keda_gpu_scaler.config.secretfile import FileVersion, file_version

log = logging.getLogger(__name__)


class ReloadingServerCredentials:
    """Server credentials that pick up renewed certificates (cert-manager, mounted Secrets) without a restart.

    grpc asks the fetcher before every new handshake; the files are re-read only when their stat changes.
    """

    def __init__(self, cert_file: Path, key_file: Path, client_ca_file: Path | None) -> None:
        self._files = [cert_file, key_file, *([client_ca_file] if client_ca_file else [])]
        self._cert_file = cert_file
        self._key_file = key_file
        self._client_ca_file = client_ca_file
        self._stamps = self._stat()
        self.reloads = 0
        self.credentials = grpc.dynamic_ssl_server_credentials(
            self._configuration(),
            self._fetch,  # type: ignore[arg-type]  # grpc-stubs omit that None means "no change"
            require_client_authentication=client_ca_file is not None,
        )

    def _stat(self) -> list[FileVersion]:
        return [file_version(f) for f in self._files]

    def _configuration(self) -> grpc.ServerCertificateConfiguration:
        key = self._key_file.read_bytes()
        chain = self._cert_file.read_bytes()
        client_ca = self._client_ca_file.read_bytes() if self._client_ca_file else None
        return grpc.ssl_server_certificate_configuration([(key, chain)], root_certificates=client_ca)

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        try:
            stamps = self._stat()
            if stamps == self._stamps:
                return None
            configuration = self._configuration()
        except OSError as error:
            # A Secret volume is swapped by symlink; a read in the middle keeps the current certificate.
            log.warning("TLS files could not be re-read, keeping the current certificate: %s", error)
            return None
        self._stamps = stamps
        self.reloads += 1
        log.info("TLS certificate files changed: reloaded for new connections")
        return configuration
