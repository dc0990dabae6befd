"""HTTP helpers shared by the sources: a size-capped body reader, error texts, exporter TLS and token."""

from __future__ import annotations

import ssl
from pathlib import Path

import aiohttp

from keda_gpu_scaler.exposition import ExpositionError
from keda_gpu_scaler.secretfile import SecretFile, SecretFileError

# Bodies are read in pieces this large: big enough that a 70 kB exporter page takes one or two reads.
READ_CHUNK = 256 * 1024


class PageTooLarge(Exception):
    pass


class PageRefused(Exception):
    """A page that arrived but is not one the source reads; the message says why."""


class RedirectRefused(Exception):
    """A 3xx answer: redirects are never followed (a trigger must not read another host's page)."""


def too_large(max_bytes: int, length: int | None = None) -> PageTooLarge:
    if length is not None:
        return PageTooLarge(f"{length} bytes; the limit is {max_bytes} (--max-page-bytes)")
    return PageTooLarge(f"more than the limit of {max_bytes} bytes (--max-page-bytes)")


def refuse_redirect(status: int, reason: str, location: str | None) -> RedirectRefused:
    where = f" to {location[:200]!r}" if location else " (no Location)"
    return RedirectRefused(f"HTTP {status} {reason}: redirect{where} refused (redirects are not followed)")


async def read_limited(response: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    """The body, refused once it exceeds max_bytes, so a hostile or broken server cannot fill memory.

    The limit counts the bytes as they come out of decompression: Content-Length is the size on the wire,
    and a gzip body of 200 kB can inflate to 200 MB.
    """
    length = response.content_length
    encoding = response.headers.get("Content-Encoding", "").strip().lower()
    if length is not None and encoding in ("", "identity"):
        if length > max_bytes:
            raise too_large(max_bytes, length)
        # The length is known, allowed and what is read: one read (aiohttp stops at Content-Length).
        return await response.read()
    body = bytearray()
    # aiohttp inflates in bounded steps as the body is consumed, so a gzip bomb is stopped at the cap.
    async for chunk in response.content.iter_chunked(READ_CHUNK):
        body += chunk
        if len(body) > max_bytes:
            raise too_large(max_bytes)
    return bytes(body)


def describe_error(error: BaseException, timeout: float) -> str:
    if isinstance(error, ExpositionError):
        return f"not a valid metrics page: {error}"
    if isinstance(error, TimeoutError):
        return f"timed out after {timeout:g}s"
    if isinstance(error, aiohttp.ClientResponseError):
        return f"HTTP {error.status} {error.message}".strip()
    if isinstance(error, PageTooLarge):
        return f"page too large: {error}"
    if isinstance(error, (PageRefused, RedirectRefused, SecretFileError)):
        return str(error)
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def exporter_ssl(ca_file: Path | None) -> ssl.SSLContext:
    """TLS for HTTPS exporters (kube-rbac-proxy): the system's CAs, or only those of `ca_file`."""
    return ssl.create_default_context(cafile=str(ca_file) if ca_file else None)


class BearerToken:
    """`Authorization: Bearer` for HTTPS exporters, from a file read again whenever it changes.

    Only ever sent over HTTPS: a token on a plain-HTTP exporter URL would cross the network in clear.
    """

    def __init__(self, path: Path | None) -> None:
        self._file = SecretFile(path, "--exporter-bearer-token-file") if path is not None else None

    def header(self, https: bool) -> str | None:
        if self._file is None or not https:
            return None
        return f"Bearer {self._file.read()}"
