"""The HTTP client of the sources: exporter pages over a lean keep-alive HTTP/1.1 GET, a size-capped body
reader for the aiohttp requests (Prometheus), and the one mapping of every failure to a FetchError whose
message is the reason a source records."""

from __future__ import annotations

import asyncio
import re
import ssl
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from keda_gpu_scaler.secretfile import SecretFile, SecretFileError
from keda_gpu_scaler.settings import Settings, SettingsError

# Bodies are read in pieces this large: big enough that a 70 kB exporter page takes one or two reads.
READ_CHUNK = 256 * 1024
# Bodies larger than this are joined from their pieces in a worker thread (where bytes.join lets go of
# the GIL: it does so from 1 MiB on).
JOIN_OFF_LOOP_BYTES = 1024 * 1024


class FetchError(Exception):
    """Why a GET gave no page: the only error the fetcher raises. The message is the reason the source
    records (and the RPCs quote), so it says what was wrong, not which Python exception was raised."""


class PageTooLarge(FetchError):
    def __str__(self) -> str:
        return f"page too large: {super().__str__()}"


class PageRefused(Exception):
    """A page that arrived but is not one the source reads; the message says why."""


class RedirectRefused(FetchError):
    """A 3xx answer: redirects are never followed (a trigger must not read another host's page)."""


def too_large(max_bytes: int, length: int | None = None) -> PageTooLarge:
    if length is not None:
        return PageTooLarge(f"{length} bytes; the limit is {max_bytes} (--max-page-bytes)")
    return PageTooLarge(f"more than the limit of {max_bytes} bytes (--max-page-bytes)")


def refuse_redirect(status: int, reason: str, location: str | None) -> RedirectRefused:
    where = f" to {location[:200]!r}" if location else " (no Location)"
    return RedirectRefused(f"HTTP {status} {reason}: redirect{where} refused (redirects are not followed)")


async def joined(pieces: list[bytes]) -> bytes:
    """The pieces of a body as one. A large one is joined in a worker thread: 15 MiB of fresh memory took
    the event loop 10 ms to fill (its page faults), and bytes.join lets other threads run meanwhile."""
    if sum(len(piece) for piece in pieces) <= JOIN_OFF_LOOP_BYTES:
        return b"".join(pieces)
    return await asyncio.to_thread(b"".join, pieces)


def _inflate_pieces(pieces: list[bytes], encoding: str, max_bytes: int) -> bytes:
    return inflate(b"".join(pieces), encoding, max_bytes)


async def read_limited(response: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    """The body, refused once it exceeds max_bytes, so a hostile or broken server cannot fill memory.

    The limit counts the bytes as they come out of decompression: Content-Length is the size on the wire,
    and a gzip body of 200 kB can inflate to 200 MB.
    """
    length = response.content_length
    encoding = response.headers.get("Content-Encoding", "").strip().lower()
    if length is not None and encoding in ("", "identity") and length > max_bytes:
        raise too_large(max_bytes, length)
    pieces: list[bytes] = []
    size = 0
    # aiohttp inflates in bounded steps as the body is consumed, so a gzip bomb is stopped at the cap.
    async for chunk in response.content.iter_chunked(READ_CHUNK):
        pieces.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            raise too_large(max_bytes)
    return await joined(pieces)


def fetch_error(error: BaseException, timeout: float) -> FetchError:
    """The one mapping of a failed request to the reason a source records. Only what a request can meet
    is mapped (the network, TLS, the clock, a secret file, aiohttp's client errors); anything else is
    a bug and is left to propagate."""
    if isinstance(error, FetchError):
        return error
    if isinstance(error, TimeoutError):
        return FetchError(f"timed out after {timeout:g}s")
    if isinstance(error, aiohttp.ClientResponseError):
        return FetchError(f"HTTP {error.status} {error.message}".strip())
    if isinstance(error, SecretFileError):
        return FetchError(str(error))
    if isinstance(error, UnicodeError):
        # A host or path that cannot be encoded (non-ASCII, an empty or over-long IDNA label), or a
        # token that is not Latin-1: the URL or the secret is wrong, and that is the reason to record.
        return FetchError(f"the URL or its credentials cannot be encoded for HTTP: {error}")
    if isinstance(error, (OSError, aiohttp.ClientError)):
        text = str(error)
        return FetchError(f"{type(error).__name__}: {text}" if text else type(error).__name__)
    raise error


# What a request can fail with before it reaches fetch_error.
REQUEST_FAILURES = (FetchError, OSError, TimeoutError, SecretFileError, UnicodeError, aiohttp.ClientError)


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


# --- a lean keep-alive HTTP/1.1 GET for exporter pages -----------------------------------------------


class HTTPStatusError(FetchError):
    """A final answer other than 200 (and not a redirect)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status} {reason}".strip())
        self.status = status


class ProtocolError(FetchError):
    """The server's answer is not HTTP/1.x as we read it; the message says what was wrong."""


MAX_HEAD_BYTES = 64 * 1024  # status line and headers
_DECODERS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
# status, reason, headers, the body as it came in pieces, its Content-Encoding (None: identity)
Answer = tuple[int, str, dict[str, str], list[bytes], str | None]


class _Answer(asyncio.Protocol):
    """One connection: sends a request, reads one answer (Content-Length, chunked or to the close).

    The body is counted as it comes out of decompression, and refused past `max_bytes`. Whatever the
    server sends, the answer ends as a body or as a FetchError saying what was wrong (ConnectionResetError
    for a connection closed before the answer was complete, which the fetcher may retry).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._waiter: asyncio.Future[Answer] | None = None

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if self._mode == "close" and self._head_done and exc is None:
            try:
                self._finish()  # a body delimited by the end of the connection
            except FetchError as failure:
                waiter.set_exception(failure)
        else:
            got = "before any answer" if not self.received else "in the middle of the answer"
            reset = ConnectionResetError(f"connection reset or closed by the server {got}")
            waiter.set_exception(exc if isinstance(exc, OSError) else reset)

    # -- one exchange
    def request(self, data: bytes, max_bytes: int) -> asyncio.Future[Answer]:
        assert self.transport is not None
        self._waiter = self._loop.create_future()
        self._max = max_bytes
        self.received = False
        self._start_head()
        self.keep_alive = True
        self.transport.write(data)
        return self._waiter

    def _start_head(self) -> None:
        self._head = bytearray()
        self._head_done = False
        self._mode = ""
        self._left = 0
        self._chunks: list[bytes] = []
        self._size = 0
        self._raw = bytearray()  # chunked framing not yet read
        self._encoding: str | None = None  # "gzip" or "deflate": the body is inflated after it is read

    def answered(self) -> None:
        """The answer was taken: forget it (later bytes are unasked for, as after any answer)."""
        self._waiter = None

    def data_received(self, data: bytes) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            # Bytes nobody asked for (after a complete answer): the connection cannot be reused.
            self.keep_alive = False
            if self.transport is not None:
                self.transport.close()
            return
        self.received = True
        try:
            while not self._head_done:
                self._head += data
                end = self._head.find(b"\r\n\r\n")
                if end < 0:
                    if len(self._head) > MAX_HEAD_BYTES:
                        raise ProtocolError(f"answer headers longer than {MAX_HEAD_BYTES} bytes")
                    return
                data = bytes(self._head[end + 4 :])
                self._read_head(bytes(self._head[:end]))
                if 100 <= self.status < 200:
                    # An interim answer (100 Continue, 103 Early Hints): the final one follows.
                    self._start_head()
                    continue
                self._head = bytearray()  # (it held the first read: often the whole page)
                self._head_done = True
                if self._mode == "none":
                    self._finish()
                    return
            self._read_body(data)
        except FetchError as error:
            self._fail(waiter, error)
        except (ValueError, zlib.error) as error:
            # Every malformation is meant to be a ProtocolError raised where it is found; one missed
            # must still end this answer as a failed source, not as a dead scrape.
            self._fail(waiter, ProtocolError(f"malformed answer ({type(error).__name__}: {error})"))

    def _fail(self, waiter: asyncio.Future[Any], error: FetchError) -> None:
        self.keep_alive = False
        if not waiter.done():
            waiter.set_exception(error)
        if self.transport is not None:
            self.transport.close()

    def _read_head(self, head: bytes) -> None:
        lines = head.decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code, _, reason = rest.partition(" ")
        if version not in ("HTTP/1.1", "HTTP/1.0") or not _is_decimal(code) or len(code) != 3:
            raise ProtocolError(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
        if code == "101":
            raise ProtocolError("101 Switching Protocols to an answer that never asked for it")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon or not name or name != name.strip() or line[0] in " \t":
                raise ProtocolError(f"malformed header line {line[:80]!r}")
            key = name.lower()
            value = value.strip(" \t")
            if key in _FRAMING and headers.get(key, value) != value:
                raise ProtocolError(f"two different {name} headers")
            headers[key] = value
        self.status, self.reason, self.headers = int(code), reason, headers
        if 100 <= self.status < 200:
            return
        if version == "HTTP/1.0" or "close" in headers.get("connection", "").lower():
            self.keep_alive = False
        encoding = headers.get("content-encoding", "identity").lower()
        if encoding not in ("identity", ""):
            if encoding not in _DECODERS:
                raise ProtocolError(f"unsupported Content-Encoding {encoding[:40]!r}")
            self._encoding = "deflate" if encoding == "deflate" else "gzip"
        transfer = headers.get("transfer-encoding")
        if self.status in (204, 304):
            self._mode = "none"
        elif transfer is not None:
            # Chunked framing is the only transfer coding servers use, and must then be the last one.
            if transfer.lower() != "chunked":
                raise ProtocolError(f"unsupported Transfer-Encoding {transfer[:40]!r}")
            self._mode = "chunked"
            self.keep_alive = self.keep_alive and "content-length" not in headers
        elif "content-length" in headers:
            text = headers["content-length"]
            if not _is_decimal(text) or len(text) > 18:
                raise ProtocolError(f"malformed Content-Length {text[:40]!r}")
            self._left = int(text)
            self._mode = "length" if self._left else "none"
            if self._left > self._max:
                raise too_large(self._max, self._left)
        else:
            self._mode = "close"
            self.keep_alive = False

    def _read_body(self, data: bytes) -> None:
        if self._mode == "length":
            if len(data) >= self._left:
                if len(data) > self._left:
                    self.keep_alive = False  # more than announced: do not trust the connection
                self._take(data[: self._left])
                self._left = 0
                self._finish()
            else:
                self._left -= len(data)
                self._take(data)
        elif self._mode == "close":
            self._take(data)
        else:
            self._read_chunks(data)

    def _read_chunks(self, data: bytes) -> None:
        raw = self._raw
        raw += data
        pos = 0
        while True:
            if self._left > 0:  # inside a chunk's data
                piece = bytes(raw[pos : pos + self._left])
                pos += len(piece)
                self._left -= len(piece)
                self._take(piece)
                if self._left:
                    break
                self._left = -1  # the CRLF after the data comes next
            if self._left == -1:
                if len(raw) - pos < 2:
                    break
                if raw[pos : pos + 2] != b"\r\n":
                    raise ProtocolError("malformed chunked body (no CRLF after a chunk)")
                pos += 2
                self._left = 0
            end = raw.find(b"\r\n", pos)
            if end < 0:
                if len(raw) - pos > 1024:
                    raise ProtocolError("malformed chunk size line")
                break
            size_text = bytes(raw[pos:end]).split(b";", 1)[0].rstrip(b" \t")
            if not _CHUNK_SIZE.fullmatch(size_text):
                raise ProtocolError(f"malformed chunk size {size_text[:20]!r}")
            size = int(size_text, 16)
            if size == 0:
                # Trailers (rare) end with an empty line: wait for it, then the answer is complete.
                if raw.find(b"\r\n\r\n", end) < 0:
                    if len(raw) - end > MAX_HEAD_BYTES:
                        raise ProtocolError("chunked trailers too long")
                    del raw[:pos]
                    return
                del raw[:]
                self._finish()
                return
            pos = end + 2
            self._left = size
        del raw[:pos]

    def _take(self, data: bytes) -> None:
        # A compressed body counts on the wire too: it is held whole until it is inflated.
        self._size += len(data)
        if self._size > self._max:
            raise too_large(self._max)
        if data:
            self._chunks.append(data)

    def _finish(self) -> None:
        assert self._waiter is not None
        if not self._waiter.done():
            self._waiter.set_result((self.status, self.reason, self.headers, self._chunks, self._encoding))
        self._chunks = []


def inflate(data: bytes, encoding: str, max_bytes: int) -> bytes:
    """A gzip or deflate body inflated, refused past max_bytes as it comes out (a gzip body of 900 kB can
    inflate to 256 MB), and refused when its stream does not end where the body does (cut short, or
    followed by bytes no such stream has). Consecutive gzip members are one body, as `cat a.gz b.gz`
    makes. Run in a worker thread: inflating 16 MiB takes the loop 7 ms and more (zlib lets other
    threads run meanwhile)."""
    if not data:
        return b""  # an empty body is empty whatever its Content-Encoding says
    wbits = _DECODERS[encoding]
    decoder = zlib.decompressobj(wbits)
    chunks: list[bytes] = []
    size = 0
    while True:
        try:
            # In steps of READ_CHUNK: the output stays in the CPU's caches (4x faster than in one call).
            out = decoder.decompress(data, min(READ_CHUNK, max_bytes - size + 1))
            if not decoder.unconsumed_tail and not decoder.eof:
                out += decoder.flush()
        except zlib.error as error:
            raise ProtocolError(f"the body is not valid {encoding} ({error})") from None
        size += len(out)
        if size > max_bytes:
            raise too_large(max_bytes)
        chunks.append(out)
        if decoder.unconsumed_tail:
            data = decoder.unconsumed_tail
            continue
        if not decoder.eof:
            # Without its end the stream was cut short: the page would silently miss its tail.
            raise ProtocolError(f"the {encoding} body ends before its end of stream (truncated)")
        if not decoder.unused_data:
            return b"".join(chunks)
        if encoding != "gzip":
            raise ProtocolError("data after the end of the deflate body")
        data = decoder.unused_data
        decoder = zlib.decompressobj(wbits)


# Headers that say where the body ends and how to read it: two that disagree leave it unknown.
_FRAMING = frozenset({"content-length", "transfer-encoding", "content-encoding"})
_CHUNK_SIZE = re.compile(rb"[0-9a-fA-F]{1,16}")


def _is_decimal(text: str) -> bool:
    """ASCII digits only: str.isdigit() is also true for '²' and '٣', which int() then refuses or reads."""
    return text.isascii() and text.isdigit()


@dataclass(frozen=True, slots=True)
class _Target:
    host: str
    port: int
    https: bool
    request: bytes  # the request without its Authorization header and final CRLF


def _target(url: str) -> _Target:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchError(f"not an http(s) URL: {url!r}")
    https = parts.scheme == "https"
    try:
        port = parts.port or (443 if https else 80)
    except ValueError as error:
        raise FetchError(f"{error} in {url!r}") from None
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host = parts.hostname
    host_header = f"[{host}]" if ":" in host else host
    if parts.port:
        host_header += f":{parts.port}"
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {host_header}\r\nUser-Agent: keda-gpu-scaler\r\n"
        "Accept: text/plain;version=0.0.4;q=1,*/*;q=0.1\r\nAccept-Encoding: identity\r\n"
    ).encode("ascii")
    return _Target(host, port, https, request)


class LeanFetcher:
    """Exporter pages over keep-alive HTTP/1.1 on asyncio, with nothing a scrape does not need.

    One connection per exporter is kept open between scrapes (each exporter is scraped by one task, one
    request at a time). Redirects are refused, bodies are capped after decompression (gzip and deflate
    answers are read even though identity is asked for), Content-Length, chunked and read-to-close
    bodies are understood, HTTPS uses `ssl_context` and sends the bearer token; plain HTTP never does.
    A request on a kept connection that the server closed meanwhile is sent again once on a new one.
    """

    def __init__(
        self,
        *,
        timeout: float,
        max_bytes: int,
        ssl_context: ssl.SSLContext | None = None,
        token: BearerToken | None = None,
    ) -> None:
        self._timeout = timeout
        self._max_bytes = max_bytes
        self._ssl = ssl_context
        self._token = token or BearerToken(None)
        self._targets: dict[str, _Target] = {}
        self._idle: dict[str, _Answer] = {}  # url → its kept connection

    async def get(self, url: str) -> bytes:
        """The body of a 200 answer; FetchError saying why there is none (and no other exception)."""
        try:
            return await self._get(url)
        except REQUEST_FAILURES as error:
            raise fetch_error(error, self._timeout) from None

    async def _get(self, url: str) -> bytes:
        target = self._targets.get(url)
        if target is None:
            target = self._targets[url] = _target(url)
        request = target.request
        bearer = self._token.header(target.https)
        if bearer is not None:
            request += f"Authorization: {bearer}\r\n".encode("latin-1")
        request += b"\r\n"
        async with asyncio.timeout(self._timeout):
            connection = self._idle.pop(url, None)
            if connection is not None and not connection.closed:
                try:
                    return await self._exchange(url, connection, request)
                except ConnectionResetError:
                    if connection.received:
                        raise
                    # The server closed the kept connection before our request reached it: once more.
            return await self._exchange(url, await self._connect(target), request)

    async def _exchange(self, url: str, connection: _Answer, request: bytes) -> bytes:
        try:
            answer = await connection.request(request, self._max_bytes)
            # The finished future holds the body: kept by the idle connection until the next scrape,
            # that is one page per exporter (70 MB for 1,000 exporters of 70 kB pages).
            connection.answered()
        except BaseException:
            # Timed out, cancelled or failed half-way: this connection's state is unknown, never reuse it.
            if connection.transport is not None:
                connection.transport.close()
            raise
        pieces = self._answer(url, connection, answer)
        encoding = answer[4]
        if encoding is not None:
            return await asyncio.to_thread(_inflate_pieces, pieces, encoding, self._max_bytes)
        return await joined(pieces)

    async def _connect(self, target: _Target) -> _Answer:
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.create_connection(
            lambda: _Answer(loop),
            target.host,
            target.port,
            ssl=(self._ssl or ssl.create_default_context()) if target.https else None,
        )
        # The returned transport, not only connection_made's: an event loop may call that one later.
        protocol.transport = transport
        return protocol

    def _answer(self, url: str, connection: _Answer, answer: Answer) -> list[bytes]:
        status, reason, headers, body, _ = answer
        if connection.keep_alive and not connection.closed and url not in self._idle:
            self._idle[url] = connection
        elif connection.transport is not None:
            connection.transport.close()  # not reusable, or another one is kept for this URL already
        if 300 <= status < 400:
            raise refuse_redirect(status, reason, headers.get("location"))
        if status != 200:
            raise HTTPStatusError(status, reason)
        return body

    def forget(self, url: str) -> None:
        """Close the kept connection of an exporter no longer scraped."""
        connection = self._idle.pop(url, None)
        self._targets.pop(url, None)
        if connection is not None and connection.transport is not None:
            connection.transport.close()

    def close(self) -> None:
        for url in list(self._idle):
            self.forget(url)


def exporter_fetcher(settings: Settings) -> LeanFetcher:
    """The fetcher of exporter and inference pages as `serve` configures it (the explain command too)."""
    try:
        context = exporter_ssl(settings.exporter_ca_file)
    except (ssl.SSLError, OSError) as error:
        raise SettingsError(f"--exporter-ca-file: {error}") from None
    return LeanFetcher(
        timeout=settings.scrape_timeout,
        max_bytes=settings.max_page_bytes,
        ssl_context=context,
        token=BearerToken(settings.exporter_bearer_token_file),
    )
