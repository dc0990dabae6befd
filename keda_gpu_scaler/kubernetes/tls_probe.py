"""Whether a server speaks TLS on a port, found by a handshake that sends nothing else.

An endpoint picker serves its metrics over plain HTTP by default and over HTTPS when given serving
certificates; nothing in the API objects says which. A TLS ClientHello answers it: a TLS server goes
on with the handshake, a plain-HTTP server answers with bytes that are not a TLS record (Go's
server: `HTTP/1.1 400 Bad Request`) or closes. Certificates are not checked here, and no request, and
so no token, is ever sent: the scrape itself verifies the certificate before it sends anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl

PROBE_TIMEOUT_SECONDS = 2.0


def _probe_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    # Only "does it speak TLS?": the certificate is verified by the scrape, never trusted from here.
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


_CONTEXT = _probe_context()


async def serves_tls(host: str, port: int, timeout: float = PROBE_TIMEOUT_SECONDS) -> bool:
    """True when the server completes a TLS handshake, False when it answers in anything else.

    Raises OSError or TimeoutError when nothing listens there (yet): not an answer either way.
    """
    try:
        async with asyncio.timeout(timeout):
            _, writer = await asyncio.open_connection(host, port, ssl=_CONTEXT, server_hostname="")
    except ssl.SSLError:
        return False
    except ConnectionResetError:
        # Closed on our ClientHello without a TLS alert: a server that does not speak TLS.
        return False
    writer.close()
    with contextlib.suppress(OSError, ssl.SSLError):
        await writer.wait_closed()
    return True
