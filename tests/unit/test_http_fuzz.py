"""The page fetcher against generated raw answers served from a real loopback socket.

Whatever a server sends, a GET ends in one of two ways: the body a correct HTTP/1.1 client would read
(when it ends its last line, as every page of the text format does), or a FetchError (the one error the
scrape path records as a failed source with its reason). Never another exception: one would end the
scrape loop instead of saying what the exporter did wrong.
"""

from __future__ import annotations

import asyncio
import gzip
import zlib
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keda_gpu_scaler.collect.http import FetchError, PageFetcher, client_session

MAX_BYTES = 4096


@dataclass(frozen=True)
class Answer:
    raw: bytes  # what the server sends, after which it closes the connection
    abort: bool  # close with a reset instead of an orderly close
    expected: bytes | None  # the body a correct client reads; None: no body (a FetchError)


async def fetch(answer: Answer) -> bytes | FetchError:
    """GET one page from a loopback server that reads the request, sends `answer.raw` and closes."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(answer.raw)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            if answer.abort:
                writer.transport.abort()
            else:
                writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    session = client_session()
    fetcher = PageFetcher(session, timeout=5.0, max_bytes=MAX_BYTES)
    try:
        return await fetcher.get(f"http://127.0.0.1:{port}/metrics")
    except FetchError as error:
        return error
    finally:
        await session.close()
        server.close()
        await server.wait_closed()


def run(answer: Answer) -> bytes | FetchError:
    return asyncio.run(fetch(answer))


# ---- well-formed answers, whole or cut short ---------------------------------------------------------

BODIES = st.one_of(
    st.binary(max_size=3000),
    st.text(alphabet='abcdefgh_{}=",.0123456789 \n#', max_size=3000).map(str.encode),
    st.just(b"x" * (MAX_BYTES + 1)),
)


def gzip_members(body: bytes, cuts: list[int]) -> bytes:
    """The body as consecutive gzip members (as `cat a.gz b.gz` makes), split at `cuts`."""
    points = sorted({min(c, len(body)) for c in cuts})
    pieces = [body[a:b] for a, b in zip([0, *points], [*points, len(body)], strict=True)]
    return b"".join(gzip.compress(piece) for piece in pieces)


def reference_decode(encoding: str, data: bytes) -> bytes | None:
    """What a correct client makes of a complete compressed body; None when it is not complete."""
    if not data:
        return b""
    try:
        if encoding == "gzip":
            return gzip.decompress(data)
        decoder = zlib.decompressobj()
        out = decoder.decompress(data) + decoder.flush()
        return out if decoder.eof and not decoder.unused_data else None
    except (EOFError, zlib.error, gzip.BadGzipFile):
        return None


def chunk_framing(data: bytes, sizes: list[int], upper: bool, extensions: bool, trailers: bool) -> bytes:
    out = bytearray()
    position = 0
    for size in sizes:
        piece = data[position : position + size]
        if not piece:
            break
        position += len(piece)
        size_text = b"%X" % len(piece) if upper else b"%x" % len(piece)
        out += size_text + (b";name=value" if extensions else b"") + b"\r\n" + piece + b"\r\n"
    if position < len(data):
        rest = data[position:]
        out += b"%x\r\n" % len(rest) + rest + b"\r\n"
    out += b"0\r\n" + (b"X-Checksum: 1\r\n" if trailers else b"") + b"\r\n"
    return bytes(out)


@st.composite
def answers(draw: st.DrawFn) -> Answer:
    body = draw(BODIES)
    encoding = draw(st.sampled_from(["identity", "gzip", "deflate"]))
    if encoding == "gzip":
        data = gzip_members(body, draw(st.lists(st.integers(0, 3000), max_size=2)))
    elif encoding == "deflate":
        data = zlib.compress(body)
    else:
        data = body
    framing = draw(st.sampled_from(["length", "chunked", "close"]))
    status = draw(st.sampled_from([200, 200, 200, 200, 404, 500, 302, 204]))
    headers = [b"Content-Type: text/plain; version=0.0.4"]
    if encoding != "identity":
        name = draw(st.sampled_from([b"Content-Encoding", b"content-encoding", b"CONTENT-ENCODING"]))
        headers.append(name + b": " + encoding.encode())
    if framing == "length":
        headers.append(b"Content-Length: %d" % len(data))
        payload = data
    elif framing == "chunked":
        headers.append(b"Transfer-Encoding: chunked")
        payload = chunk_framing(
            data,
            draw(st.lists(st.integers(1, 700), max_size=6)),
            draw(st.booleans()),
            draw(st.booleans()),
            draw(st.booleans()),
        )
    else:
        headers.append(b"Connection: close")
        payload = data
    if status == 302:
        headers.append(b"Location: http://elsewhere/")
    if status == 204:
        payload = b""
        headers = [h for h in headers if not h.startswith((b"Content-Length", b"Transfer-Encoding"))]
    interim = b"HTTP/1.1 100 Continue\r\n\r\n" if draw(st.booleans()) else b""
    head = interim + b"HTTP/1.1 %d Whatever\r\n" % status + b"".join(h + b"\r\n" for h in headers) + b"\r\n"
    raw = head + payload
    cut = draw(st.one_of(st.none(), st.integers(0, len(raw) - 1)))
    abort = draw(st.booleans())

    expected: bytes | None = body
    if status != 200:
        expected = None
    elif cut is not None:
        raw = raw[:cut]
        if cut < len(head) or framing != "close":
            expected = None  # the head, the announced length or the last chunk never came
        elif encoding == "identity":
            expected = payload[: cut - len(head)]
        else:
            expected = reference_decode(encoding, payload[: cut - len(head)])
    if expected is not None and len(expected) > MAX_BYTES:
        expected = None
    if expected and not expected.endswith(b"\n"):
        expected = None  # a page that does not end its last line was cut short, whatever its framing
    return Answer(raw, abort, expected)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(answer=answers())
def test_a_well_formed_answer_reads_as_its_body_and_a_cut_one_as_a_fetch_error(answer: Answer) -> None:
    result = run(answer)
    if answer.expected is None:
        assert isinstance(result, FetchError), result
    elif answer.abort:
        # A reset may reach the client before the last bytes: then the page is missing, never wrong.
        assert result == answer.expected or isinstance(result, FetchError), result
    else:
        assert result == answer.expected, result


# ---- hostile answers: garbage where numbers, names and framing belong ---------------------------------

NASTY_NUMBERS = ["²", "٣", "2²0", "0x10", "+5", "-1", " 5", "1_0", "5 ", "", "99999999999999999999", "1e3"]
NASTY = st.sampled_from(
    [n.encode("utf-8") for n in NASTY_NUMBERS] + [n.encode("latin-1", "replace") for n in NASTY_NUMBERS]
)


@st.composite
def hostile_answers(draw: st.DrawFn) -> Answer:
    kind = draw(st.sampled_from(["status", "length", "chunk", "encoding", "header", "mutated", "bytes"]))
    body = b"DCGM_FI_DEV_GPU_UTIL 1\n"
    if kind == "status":
        raw = b"HTTP/1.1 " + draw(NASTY) + b" OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    elif kind == "length":
        raw = b"HTTP/1.1 200 OK\r\nContent-Length: " + draw(NASTY) + b"\r\n\r\n" + body
    elif kind == "chunk":
        raw = (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            + draw(NASTY)
            + b"\r\n"
            + body
            + b"\r\n0\r\n\r\n"
        )
    elif kind == "encoding":
        name = draw(st.sampled_from([b"gzip", b"deflate", b"x-gzip", b"br", b"gzip, gzip", b"identity"]))
        payload = draw(st.one_of(st.binary(max_size=200), st.just(gzip.compress(body)[:-3])))
        raw = (
            b"HTTP/1.1 200 OK\r\nContent-Encoding: "
            + name
            + b"\r\nContent-Length: %d\r\n\r\n" % len(payload)
            + payload
        )
    elif kind == "header":
        line = draw(st.binary(max_size=60).filter(lambda b: b"\r\n" not in b))
        raw = b"HTTP/1.1 200 OK\r\n" + line + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    elif kind == "mutated":
        raw = bytearray(draw(answers()).raw)
        for _ in range(draw(st.integers(1, 4))):
            if not raw:
                break
            at = draw(st.integers(0, len(raw) - 1))
            action = draw(st.sampled_from(["flip", "delete", "insert"]))
            if action == "flip":
                raw[at] ^= draw(st.integers(1, 255))
            elif action == "delete":
                del raw[at]
            else:
                raw[at:at] = draw(st.binary(min_size=1, max_size=8))
        raw = bytes(raw)
    else:
        raw = draw(st.binary(max_size=300))
    return Answer(raw, draw(st.booleans()), None)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(answer=hostile_answers())
def test_any_answer_is_a_body_within_the_cap_or_a_fetch_error(answer: Answer) -> None:
    result = run(answer)
    assert isinstance(result, (bytes, FetchError)), result
    if isinstance(result, bytes):
        assert len(result) <= MAX_BYTES
