"""The alternative the lean fetcher is measured against: exporter pages GET with aiohttp, as a user of the
usual Python HTTP client would write it (no redirects, the body capped after decompression)."""

from __future__ import annotations

import aiohttp

from keda_gpu_scaler.collect.http import read_limited, refuse_redirect


class AiohttpFetcher:
    """One page per GET over an aiohttp session: the same contract as collect/http.py's LeanFetcher."""

    def __init__(self, session: aiohttp.ClientSession, timeout: float, max_bytes: int) -> None:
        self._session = session
        self._max_bytes = max_bytes
        self._timeout = aiohttp.ClientTimeout(total=timeout)  # one object for every request

    async def get(self, url: str) -> bytes:
        async with self._session.get(
            url, headers={"Accept-Encoding": "identity"}, timeout=self._timeout, allow_redirects=False
        ) as response:
            if 300 <= response.status < 400:
                raise refuse_redirect(
                    response.status, response.reason or "", response.headers.get("Location")
                )
            if response.status != 200:
                raise aiohttp.ClientResponseError(
                    response.request_info, (), status=response.status, message=response.reason or ""
                )
            return await read_limited(response, self._max_bytes)

    def forget(self, url: str) -> None:
        pass  # the session's pool ages its connections out

    def close(self) -> None:
        pass  # the session is closed by its owner
