"""The HTTP client both engine clients use (the Parrot engine's, the OpenAI adapter's upstream).

aiohttp: a request costs a quarter to two fifths of httpx's CPU (0.24 / 0.95 ms a GET / POST
against 0.96 / 2.36, measured on a 2-core AMD EPYC), CPU the manager's process would otherwise take
from an engine sharing the machine. No cap on connections: how much runs on an engine at once is
the manager's decision, not a pool's. A session is made on first use, on the loop that uses it.
"""

from __future__ import annotations

import aiohttp

from parrot.protocol.engine_client import EngineUnavailable

# What a request that failed on its way (refused, dropped, timed out) raises.
TRANSPORT_ERRORS = (aiohttp.ClientError, TimeoutError)


class LazyClient:
    def __init__(self, base_url: str, timeout_s: float, headers: dict[str, str] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = headers or {}
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=self._timeout,
                headers=self._headers,
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    def unavailable(self, e: BaseException) -> EngineUnavailable:
        return EngineUnavailable(f"engine {self.base_url} is unreachable: {type(e).__name__}: {e}")
