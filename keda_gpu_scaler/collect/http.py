"""The HTTP client of the sources: every page GET and every Prometheus query goes through `request` over
the app's one aiohttp session, with the same limits, and every failure becomes a FetchError whose message
is the reason a source records."""

from __future__ import annotations

import asyncio
import math
import ssl
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from keda_gpu_scaler.collect.page_workers import in_page_worker
from keda_gpu_scaler.config.secretfile import SecretFile, SecretFileError
from keda_gpu_scaler.config.settings import Settings, SettingsError

# Bodies are read in pieces this large: big enough that a 70 kB exporter page takes one or two reads.
READ_CHUNK = 256 * 1024
# Bodies larger than this are joined from their pieces in a worker thread (where bytes.join lets go of
# the GIL: it does so from 1 MiB on).
JOIN_OFF_LOOP_BYTES = 1024 * 1024
USER_AGENT = "keda-gpu-scaler"
# Compressed input is given to zlib this much at a time: what zlib copies of the input it has not used
# (at a member's end, or when the output step is full) is at most this, so inflating stays linear in the
# body however many members it has.
INFLATE_INPUT_STEP = 64 * 1024
# A real page is one gzip member (`cat a.gz b.gz` makes two). Each member costs a new decoder: a body of
# thousands of empty 20-byte members is an attack, not a page.
MAX_GZIP_MEMBERS = 64
# A body read in more pieces than this, and more than one per PIECE_BYTES on average, is refused: each
# piece (an HTTP chunk, or what one socket read brought) costs the event loop a parser call and a read
# whatever its size, and a body of 1-byte chunks (6 bytes each on the wire) stays under --max-page-bytes
# for the whole timeout while it keeps the loop busy. Real pages come in pieces of KiBs (Go's net/http
# sends 2-4 KiB chunks); one exposition line per chunk still averages far above PIECE_BYTES.
MAX_SMALL_PIECES = 1024
PIECE_BYTES = 32
# Idle kept connections are closed after this long at least (longer when pages are fetched less often):
# one connection per source is reused from one scrape to the next.
MIN_KEEPALIVE_SECONDS = 15.0


class FetchError(Exception):
    """Why a request gave no answer: the only error `request` raises. The message is the reason the
    source records (and the RPCs quote), so it says what was wrong, not which Python exception was raised."""


class PageTooLarge(FetchError):
    def __str__(self) -> str:
        return f"page too large: {super().__str__()}"


class PageRefused(Exception):
    """A page that arrived but is not one the source reads; the message says why."""


class RedirectRefused(FetchError):
    """A 3xx answer: redirects are never followed (a trigger must not read another host's page)."""


class HTTPStatusError(FetchError):
    """A final answer other than 200 (and not a redirect) where a page was asked for."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(f"HTTP {status} {reason}".strip())
        self.status = status


def too_large(max_bytes: int, length: int | None = None) -> PageTooLarge:
    if length is not None:
        return PageTooLarge(f"{length} bytes; the limit is {max_bytes} (--max-page-bytes)")
    return PageTooLarge(f"more than the limit of {max_bytes} bytes (--max-page-bytes)")


def refuse_redirect(status: int, reason: str, location: str | None) -> RedirectRefused:
    where = f" to {location[:200]!r}" if location else " (no Location)"
    return RedirectRefused(f"HTTP {status} {reason}: redirect{where} refused (redirects are not followed)")


def fetch_error(error: BaseException, timeout: float) -> FetchError:
    """The one mapping of a failed request to the reason a source records. Only what a request can meet
    is mapped (the network, TLS, the clock, a secret file, aiohttp's client errors); anything else is
    a bug and is left to propagate."""
    if isinstance(error, FetchError):
        return error
    if isinstance(error, TimeoutError):
        return FetchError(f"timed out after {timeout:g}s")
    if isinstance(error, asyncio.IncompleteReadError):
        return FetchError(
            f"the answer's body is cut short (truncated): {len(error.partial)} of {error.expected} bytes"
        )
    if isinstance(error, aiohttp.ClientPayloadError):
        # The head was read, the body was not: its announced length or last chunk never came, or its
        # framing is broken. (aiohttp's cause holds the parser's words.)
        detail = getattr(error.__cause__, "message", None) or str(error)
        return FetchError(f"the answer's body is cut short or malformed (truncated): {_tidy(str(detail))}")
    if isinstance(error, aiohttp.ClientResponseError):
        # `request` never asks aiohttp to raise for a status: this is its parser refusing the answer
        # (its `status` is the 400 a server would answer such a request with, not the server's).
        return FetchError(f"not a valid HTTP/1.x answer: {_tidy(error.message)}")
    if isinstance(error, SecretFileError):
        return FetchError(str(error))
    if isinstance(error, UnicodeError):
        # A host or path that cannot be encoded (non-ASCII, an empty or over-long IDNA label), or a
        # token that is not Latin-1: the URL or the secret is wrong, and that is the reason to record.
        return FetchError(f"the URL or its credentials cannot be encoded for HTTP: {error}")
    if isinstance(error, (OSError, aiohttp.ClientError, ValueError)):
        # (ValueError: aiohttp and yarl refuse some malformed URLs and header values with it.)
        text = str(error)
        return FetchError(f"{type(error).__name__}: {text}" if text else type(error).__name__)
    raise error


def _tidy(text: str, limit: int = 300) -> str:
    """A parser's multi-line message (the bad line, a caret under the bad byte) on one line, bounded."""
    parts = [part for line in text.splitlines() if (part := line.strip()) and part.strip("^ ")]
    joined = " ".join(parts)
    return joined if len(joined) <= limit else joined[:limit] + "..."


# What a request can fail with before it reaches fetch_error.
REQUEST_FAILURES = (
    FetchError,
    asyncio.IncompleteReadError,
    OSError,
    TimeoutError,
    SecretFileError,
    UnicodeError,
    ValueError,
    aiohttp.ClientError,
)


def client_session(keepalive: float = MIN_KEEPALIVE_SECONDS) -> aiohttp.ClientSession:
    """The scaler's one HTTP session (the app owns and closes it): one connection pool for every source.

    - No connection limit here: each collector bounds its own requests in flight (--scrape-concurrency),
      and a pool-wide cap would let one kind of source starve another.
    - Bodies are not decompressed by aiohttp: `request` inflates them itself, in a page worker, with
      the size cap counted on what comes out and a stream cut before its end refused (aiohttp's decoder
      accepts a gzip stream that ends early).
    - trust_env=False: HTTP(S)_PROXY and NO_PROXY are not read, as the scaler always did. Exporters,
      inference servers and endpoint pickers are reached at pod IPs inside the cluster, which a proxy
      set for the way out would either break or carry outside; Prometheus is given by URL.
    - No cookies: no source sets any that the scaler should send back.
    """
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=max(keepalive, MIN_KEEPALIVE_SECONDS)),
        auto_decompress=False,
        trust_env=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        read_bufsize=READ_CHUNK,
        # No deadline of aiohttp's: `request` sets its own around each exchange.
        timeout=aiohttp.ClientTimeout(),
    )


def keepalive_for(settings: Settings) -> float:
    """How long an idle connection is kept: past the longest wait between two scrapes of one source."""
    longest = max(settings.scrape_interval, settings.gateway_interval)
    return 2 * longest + settings.scrape_timeout


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    reason: str
    location: str | None  # the Location header, where there is one
    body: bytes  # decompressed, at most the request's max_bytes


async def request(
    session: aiohttp.ClientSession,
    url: str,
    *,
    timeout: float,
    max_bytes: int,
    ssl_context: ssl.SSLContext | bool = True,
    headers: dict[str, str] | None = None,
    form: dict[str, str] | None = None,
) -> Answer:
    """GET `url` (POST `form`, when given): the answer, whatever its status; FetchError saying why there
    is none, and no other exception.

    The same limits for every request: `timeout` for the whole exchange (connecting included), no
    redirect followed (a 3xx is an answer like any other: the caller refuses it), the body refused once
    it exceeds `max_bytes` after decompression (gzip and deflate are read whatever was asked for), a
    body cut short refused (its length or last chunk never came, its compressed stream has no end).
    """
    if session.auto_decompress:
        # Its bodies would arrive inflated under a Content-Encoding header that says otherwise.
        raise TypeError("an HTTP session of the sources must be made by client_session()")
    # Inflating counts against the timeout too: the worker stops at the deadline (a cancelled await
    # would not stop it).
    deadline = time.monotonic() + timeout
    try:
        # The deadline is asyncio's, over the whole exchange: aiohttp's own timers per request cost more.
        async with asyncio.timeout(timeout):
            response = await session.request(
                "GET" if form is None else "POST",
                url,
                data=form,
                headers=headers,
                ssl=ssl_context,
                allow_redirects=False,
            )
            try:
                encoding = _content_encoding(response)
                body = await _read_limited(response, max_bytes)
            finally:
                response.release()
            if encoding is not None and body:
                # An empty body is empty whatever its Content-Encoding says.
                body = await in_page_worker(inflate, body, encoding, max_bytes, deadline)
    except REQUEST_FAILURES as error:
        raise fetch_error(error, timeout) from error
    return Answer(response.status, response.reason or "", response.headers.get("Location"), body)


_DECODERS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def _content_encoding(response: aiohttp.ClientResponse) -> str | None:
    """gzip or deflate, None for identity; FetchError for anything else or two that disagree."""
    headers = response.headers
    if "Content-Encoding" not in headers:
        return None
    found = {value.strip().lower() for value in headers.getall("Content-Encoding")}
    found.discard("identity")
    found.discard("")
    if not found:
        return None
    if len(found) > 1:
        raise FetchError("two different Content-Encoding headers")
    (encoding,) = found
    if encoding == "x-gzip":
        return "gzip"
    if encoding not in _DECODERS:
        raise FetchError(f"unsupported Content-Encoding {encoding[:40]!r}")
    return encoding


async def _read_limited(response: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    """The body as it came over the wire, refused once it exceeds max_bytes (a compressed body counts on
    the wire too: it is held whole until it is inflated), so a hostile server cannot fill memory."""
    length = response.content_length
    if length is not None and length > max_bytes:
        raise too_large(max_bytes, length)
    content = response.content
    if length is not None and length <= JOIN_OFF_LOOP_BYTES:
        # (The common case, in one call: the parser ends the body at the announced length, and fails
        # the read when the connection ends first.)
        return await content.readexactly(length) if length else b""
    pieces: list[bytes] = []
    size = 0
    while True:
        # Piece by piece as they came (readany() would join them): their number is what is bounded.
        chunk, end_of_chunk = await content.readchunk()
        if not chunk:
            if end_of_chunk and not content.at_eof():
                continue  # the end of an HTTP chunk already read
            break  # (aiohttp's one empty body answers (b"", True) for ever once read)
        pieces.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            raise too_large(max_bytes)
        if len(pieces) > MAX_SMALL_PIECES and len(pieces) * PIECE_BYTES > size:
            raise FetchError(
                f"the body came in {len(pieces)} pieces for {size} bytes (HTTP chunks or reads of a few"
                f" bytes each; more than {MAX_SMALL_PIECES} pieces are read only while they average"
                f" {PIECE_BYTES} bytes or more): refused, a page comes in pieces of KiBs"
            )
    if len(pieces) == 1:
        return pieces[0]
    if size <= JOIN_OFF_LOOP_BYTES:
        return b"".join(pieces)
    # 15 MiB of fresh memory took the event loop 10 ms to fill (its page faults); bytes.join lets other
    # threads run meanwhile.
    return await in_page_worker(b"".join, pieces)


def inflate(data: bytes, encoding: str, max_bytes: int, deadline: float = math.inf) -> bytes:
    """A gzip or deflate body inflated, refused past max_bytes as it comes out (a gzip body of 900 kB can
    inflate to 256 MB), and refused when its stream does not end where the body does (cut short, or
    followed by bytes no such stream has). Consecutive gzip members are one body, as `cat a.gz b.gz`
    makes, up to MAX_GZIP_MEMBERS. Linear in the body: the input is read at an offset, never sliced
    anew. TimeoutError once time.monotonic() passes `deadline`, checked between steps: run in a page
    worker (inflating 16 MiB takes 7 ms and more), which a cancelled await would not stop."""
    wbits = _DECODERS[encoding]
    view = memoryview(data)
    decoder = zlib.decompressobj(wbits)
    members = 1
    chunks: list[bytes] = []
    size = offset = 0
    while True:
        if time.monotonic() > deadline:
            raise TimeoutError
        piece = view[offset : offset + INFLATE_INPUT_STEP]
        # In steps of READ_CHUNK: the output stays in the CPU's caches (4x faster than in one call).
        room = min(READ_CHUNK, max_bytes - size + 1)
        try:
            out = decoder.decompress(piece, room)
        except zlib.error as error:
            raise FetchError(f"the body is not valid {encoding} ({error})") from error
        offset += len(piece) - len(decoder.unconsumed_tail) - len(decoder.unused_data)
        size += len(out)
        if size > max_bytes:
            raise too_large(max_bytes)
        chunks.append(out)
        if decoder.eof:
            if offset == len(view):
                return b"".join(chunks)
            if encoding != "gzip":
                raise FetchError("data after the end of the deflate body")
            members += 1
            if members > MAX_GZIP_MEMBERS:
                raise FetchError(f"more than {MAX_GZIP_MEMBERS} gzip members in one body (a page is one)")
            decoder = zlib.decompressobj(wbits)
        elif offset == len(view) and len(out) < room:
            # Every byte read and nothing more to come out, without the end of the stream: it was cut
            # short, and the page would silently miss its tail.
            raise FetchError(f"the {encoding} body ends before its end of stream (truncated)")


def exporter_ssl(ca_file: Path | None) -> ssl.SSLContext:
    """TLS for HTTPS exporters (kube-rbac-proxy): the system's CAs, or only those of `ca_file`."""
    return ssl.create_default_context(cafile=str(ca_file) if ca_file else None)


def is_https(url: str) -> bool:
    return url[:8].lower() == "https://"


class BearerToken:
    """`Authorization: Bearer` for HTTPS exporters, from a file read again whenever it changes.

    Only ever sent over HTTPS: a token on a plain-HTTP exporter URL would cross the network in clear.
    """

    def __init__(self, path: Path | None) -> None:
        self._file = SecretFile(path, "--exporter-bearer-token-file") if path is not None else None

    def header(self, url: str) -> str | None:
        if self._file is None or not is_https(url):
            return None
        return f"Bearer {self._file.read()}"


# What a metrics page is asked for with: the text format, and no compression (the sources are near,
# and inflating costs the scaler CPU; a compressed answer is read all the same).
PAGE_HEADERS = {
    "User-Agent": USER_AGENT,
    "Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1",
    "Accept-Encoding": "identity",
}


def complete_page(body: bytes) -> bytes:
    """The body, if it ends its last line: the text format ends every line with a newline, so a page
    without the final one was cut short, whatever its framing said (a read-to-close body has no other
    sign of it). A page cut inside `12` would read as 1."""
    if body and not body.endswith(b"\n"):
        raise FetchError(
            "the page does not end with a newline, as every page in the text format does: truncated"
            " (cut short), or not a metrics page"
        )
    return body


class PageFetcher:
    """GETs metrics pages (exporters, inference servers, endpoint pickers) over the app's session.

    The body of a 200 answer that ends its last line, or a FetchError saying why there is none. HTTPS
    uses `ssl_context` and sends the bearer token; plain HTTP never does. Redirects are refused.
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        *,
        timeout: float,
        max_bytes: int,
        ssl_context: ssl.SSLContext | None = None,
        token: BearerToken | None = None,
    ) -> None:
        self._session = session  # owned by the app, which closes it
        self._timeout = timeout
        self._max_bytes = max_bytes
        self._ssl: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True
        self._token = token or BearerToken(None)

    async def get(self, url: str) -> bytes:
        https = is_https(url)
        headers = PAGE_HEADERS
        try:
            bearer = self._token.header(url)
        except SecretFileError as error:
            raise fetch_error(error, self._timeout) from error
        if bearer is not None:
            headers = {**PAGE_HEADERS, "Authorization": bearer}
        answer = await request(
            self._session,
            url,
            timeout=self._timeout,
            max_bytes=self._max_bytes,
            ssl_context=self._ssl if https else True,
            headers=headers,
        )
        if 300 <= answer.status < 400:
            raise refuse_redirect(answer.status, answer.reason, answer.location)
        if answer.status != 200:
            raise HTTPStatusError(answer.status, answer.reason)
        return complete_page(answer.body)


def exporter_fetcher(session: aiohttp.ClientSession, settings: Settings) -> PageFetcher:
    """The fetcher of exporter and inference pages as `serve` configures it (the explain command too)."""
    try:
        context = exporter_ssl(settings.exporter_ca_file)
    except (ssl.SSLError, OSError) as error:
        raise SettingsError(f"--exporter-ca-file: {error}") from error
    return PageFetcher(
        session,
        timeout=settings.scrape_timeout,
        max_bytes=settings.max_page_bytes,
        ssl_context=context,
        token=BearerToken(settings.exporter_bearer_token_file),
    )
