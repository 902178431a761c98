"""The public HTTP API as async Python calls (one aiohttp client per session).

Every 4xx/5xx answer becomes the ParrotError the server described (status, message, field); a
manager that cannot be reached becomes ParrotError(503). Transient faults are retried with
exponential backoff (`max_retries`, `backoff_s` doubling up to 10 s, or the answer's Retry-After):
a request that never reached the server (connection refused or timed out while connecting) always;
a read (GET, DELETE) also after a dropped connection or a 429/502/503/504 answer. A submit or a set
is repeated only when the manager itself refused it with 429 (a quota) or 503 (no live engine,
shutting down): its error body says it applied nothing (a batch is all or nothing). After a
dropped connection, or a 5xx from something else (a proxy), it may have arrived: not repeated.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request
import weakref
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar
from urllib.parse import urlsplit

import aiohttp

from parrot.protocol.errors import ParrotError
from parrot.protocol.framing import text_lines
from parrot.protocol.objective import Criteria
from parrot.protocol.public_api import (
    CreateSessionRequest,
    RunRequest,
    RunResult,
    SessionCreated,
    SessionStatus,
    SetVariableRequest,
    StreamChunk,
    SubmitRequest,
    SubmitResponse,
    VariableList,
    VariableValue,
)

_RETRY_STATUSES = frozenset({429, 502, 503, 504})
_MAX_BACKOFF_S = 10.0
_CONNECT_TIMEOUT_S = 10.0
_KEEPALIVE_S = 4.0  # an idle connection's life in the client (uvicorn keeps one 5 s)
_LINGER = "parrot-connections-linger"  # the name of the task that closes them


@dataclass(frozen=True)
class _Answer:
    """A response with its body read (or, for a stream, left to read from `stream`)."""

    status: int
    headers: Mapping[str, str]  # case-insensitive (aiohttp's)
    body: bytes
    stream: aiohttp.ClientResponse | None = None

    def json(self) -> Any:
        return json.loads(self.body)


class _Connections:
    """The TCP connections of the sessions open on one event loop: a new session reuses one kept
    alive by another instead of connecting (a session per application run would otherwise cost a
    connect and an accept each). No limit on connections (a session's long-polling gets each hold
    one). When the loop's last session closes they linger while they would be kept alive anyway
    (`_KEEPALIVE_S`), so the next one-request `arun` of a stream of them reuses one too (a connect
    and an accept cost the client and the manager ~1 ms of CPU a run); then they close. At the
    loop's end: `asyncio.run` cancels the lingering task, which closes them; a session closed by a
    task being cancelled (asyncio.run ending with sessions open) does not linger; a loop stopped
    without cancelling its tasks (a sync `Session`'s, or one a caller runs and closes) calls
    `end_of_loop` first; a loop closed without it is found closed by the next `acquire`, and its
    connections are dropped then."""

    _lock: ClassVar[threading.Lock] = threading.Lock()  # sync Sessions run their loops on threads of their own
    # Keyed weakly, but each entry holds its loop (the connector's): an entry goes only when removed.
    _by_loop: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Connections]] = weakref.WeakKeyDictionary()

    def __init__(self) -> None:
        # kept alive for less than the 5 s uvicorn keeps an idle connection: never sent on one it closed
        self.connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=_KEEPALIVE_S)
        self.num_users = 0
        self.idle_since = 0.0  # the loop's time when the last session closed
        self.linger: asyncio.Task[None] | None = None
        # base URL -> the environment's proxy for it, read once while sessions share these
        # connections (0.3 ms of CPU a read: a one-request `arun` would pay it on every call)
        self.proxies: dict[str, str | None] = {}

    @classmethod
    def acquire(cls, base_url: str) -> tuple[aiohttp.TCPConnector, str | None]:
        """The loop's shared connector, and the proxy the environment names for `base_url`."""
        loop = asyncio.get_running_loop()
        with cls._lock:
            for dead in [other for other in cls._by_loop if other.is_closed()]:
                # Closed while its connections lingered (no end_of_loop): nothing can run on it;
                # the connector lets go of its sockets, which close with their transports, and
                # the linger task, which can never run again, goes without a "destroyed" warning.
                gone = cls._by_loop.pop(dead)
                gone.connector._close()
                if gone.linger is not None:
                    gone.linger._log_destroy_pending = False  # type: ignore[attr-defined]
            shared = cls._by_loop.get(loop)
            if shared is None or shared.connector.closed:
                shared = cls._by_loop[loop] = _Connections()
            shared.num_users += 1
            if base_url not in shared.proxies:
                shared.proxies[base_url] = _env_proxy(base_url)
            return shared.connector, shared.proxies[base_url]

    @classmethod
    async def release(cls, connector: aiohttp.TCPConnector) -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        ending = task is not None and task.cancelling() > 0  # asyncio.run's end, Ctrl-C: no lingering
        with cls._lock:
            shared = cls._by_loop.get(loop)
            if shared is not None and shared.connector is connector:
                shared.num_users -= 1
                if shared.num_users:
                    return
                if not ending:
                    shared.idle_since = loop.time()
                    if shared.linger is None:
                        shared.linger = loop.create_task(shared._expire(loop), name=_LINGER)
                    return
                del cls._by_loop[loop]
                if shared.linger is not None:
                    shared.linger.cancel()  # it finds the entry gone: closes nothing
        await connector.close()

    async def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close the connections once unused for `_KEEPALIVE_S` (or when cancelled at the loop's
        end); a session that takes them meanwhile ends the wait and keeps them."""
        try:
            while self.num_users == 0 and (wait := self.idle_since + _KEEPALIVE_S - loop.time()) > 0:
                await asyncio.sleep(wait)
        finally:
            with _Connections._lock:
                self.linger = None
                expired = self.num_users == 0 and _Connections._by_loop.get(loop) is self
                if expired:
                    del _Connections._by_loop[loop]
            if expired:
                await self.connector.close()


async def end_of_loop() -> None:
    """Close the running loop's idle connections and end its lingering tasks (one may not have
    started, or may be closing): the last step of a loop that is stopped or closed without
    cancelling its tasks (`asyncio.run` needs none of this: it cancels them)."""
    loop = asyncio.get_running_loop()
    with _Connections._lock:
        shared = _Connections._by_loop.get(loop)
        if shared is not None and shared.num_users == 0:
            del _Connections._by_loop[loop]
        else:
            shared = None  # none, or in use: its sessions close it
    lingering = [t for t in asyncio.all_tasks(loop) if t.get_name() == _LINGER]
    for t in lingering:
        t.cancel()
    await asyncio.gather(*lingering, return_exceptions=True)
    if shared is not None:
        await shared.connector.close()


class ApiTransport:
    """The session's HTTP client (aiohttp: a quarter to two fifths of httpx's CPU a request, see
    backends/http_client.py; made on first use, on the loop that uses it, over that loop's shared
    connections)."""

    def __init__(self, base_url: str, timeout_s: float = 660.0, max_retries: int = 4, backoff_s: float = 0.25) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=_CONNECT_TIMEOUT_S, sock_read=timeout_s)
        self._http: aiohttp.ClientSession | None = None
        self._proxy: str | None = None  # the environment's, read with the loop's shared connections
        self._headers: dict[str, str] = {}
        self.session_id = ""
        self.num_submits = 0  # batches sent (thousands of calls take a handful)
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.num_retries = 0  # requests sent again after a transient fault

    def _client(self) -> aiohttp.ClientSession:
        if self._http is None:
            jar = aiohttp.DummyCookieJar()  # the API sets no cookies
            connector, self._proxy = _Connections.acquire(self.base_url)
            self._http = aiohttp.ClientSession(
                timeout=self._timeout, cookie_jar=jar, connector=connector, connector_owner=False
            )
        return self._http

    async def _request(self, method: str, path: str, stream: bool = False, **kw: Any) -> _Answer:
        """One request, retried on transient faults (module docstring); ParrotError(503) if the
        manager stays unreachable. `stream`: a success's body is left unread in `stream` (the
        caller releases it)."""
        idempotent = method in ("GET", "DELETE")
        url = self.base_url + path
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            delay = min(_MAX_BACKOFF_S, self.backoff_s * 2**attempt)
            try:
                resp = await self._client().request(method, url, proxy=self._proxy, **kw)
                if stream and resp.status < 400:
                    return _Answer(resp.status, resp.headers, b"", resp)
                try:
                    answer = _Answer(resp.status, resp.headers, await resp.read())
                finally:
                    resp.release()
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as e:  # never reached the server
                if last:
                    raise ParrotError(f"cannot reach the manager at {self.base_url}: {e}", status=503) from e
            except (aiohttp.ClientError, TimeoutError) as e:  # may have reached it
                if last or not idempotent:
                    raise ParrotError(
                        f"the connection to the manager failed: {type(e).__name__}: {e}", status=503
                    ) from e
            else:
                status = answer.status
                refused = status in (429, 503) and _is_parrot_error(answer)  # nothing was applied
                if last or status not in _RETRY_STATUSES or not (idempotent or refused):
                    return answer
                retry_after = answer.headers.get("retry-after", "")
                delay = min(_MAX_BACKOFF_S, float(retry_after)) if retry_after.isdigit() else delay
            self.num_retries += 1
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        if self._http is not None:
            http, self._http = self._http, None
            connector = http.connector
            await http.close()
            assert isinstance(connector, aiohttp.TCPConnector)
            await _Connections.release(connector)

    async def create_session(
        self, api_key: str | None, idle_timeout_s: float | None, submit: SubmitRequest | None = None
    ) -> SessionCreated:
        """A new session; with `submit`, its first batch goes in the same request."""
        req = CreateSessionRequest(idle_timeout_s=idle_timeout_s, submit=submit)
        body = req.model_dump(mode="json", exclude_defaults=True)
        self.num_submits += submit is not None
        resp = await self._request("POST", "/v1/sessions", json=body, headers=_key_header(api_key))
        created = SessionCreated.model_validate(_checked(resp))
        self.session_id = created.session_id
        self._headers = {"Authorization": f"Bearer {created.token}"}
        return created

    async def run(self, api_key: str | None, req: RunRequest) -> RunResult:
        """A batch run to its end in a session of its own (`POST /v1/run`): one request."""
        body = req.model_dump(mode="json", exclude_defaults=True)
        self.num_submits += 1
        resp = await self._request("POST", "/v1/run", json=body, headers=_key_header(api_key))
        return RunResult.model_validate(_checked(resp))

    async def delete_session(self) -> None:
        _checked(await self._request("DELETE", self._path(""), headers=self._headers))

    async def status(self) -> SessionStatus:
        return SessionStatus.model_validate(_checked(await self._request("GET", self._path(""), headers=self._headers)))

    async def submit(self, req: SubmitRequest) -> SubmitResponse:
        body = req.model_dump(mode="json", exclude_defaults=True)
        self.num_submits += 1
        resp = await self._request("POST", self._path("/submit"), json=body, headers=self._headers)
        return SubmitResponse.model_validate(_checked(resp))

    async def set_variable(self, var_id: str, value: str | None, error: str | None = None) -> None:
        body = SetVariableRequest(value=value, error=error).model_dump(mode="json", exclude_none=True)
        _checked(await self._request("PUT", self._path(f"/variables/{var_id}"), json=body, headers=self._headers))

    async def get_variable(self, var_id: str, criteria: Criteria, timeout_s: float) -> VariableValue:
        params = {"criteria": criteria.value, "timeout_s": timeout_s}
        resp = await self._request(
            "GET",
            self._path(f"/variables/{var_id}"),
            params=params,
            headers=self._headers,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=_CONNECT_TIMEOUT_S, sock_read=timeout_s + 30.0),
        )
        return VariableValue.model_validate(_checked(resp))

    async def stream_variable(self, var_id: str, criteria: Criteria) -> AsyncIterator[str]:
        path = self._path(f"/variables/{var_id}/stream")
        params = {"criteria": criteria.value}
        answer = await self._request("GET", path, stream=True, params=params, headers=self._headers)
        if answer.stream is None:
            _checked(answer)
            raise ParrotError("the variable stream answered no stream", status=502)
        resp = answer.stream
        try:
            async for line in text_lines(resp.content.iter_any()):
                if not line.strip():
                    continue
                chunk = StreamChunk.model_validate_json(line)
                if chunk.error is not None:
                    raise ParrotError(chunk.error.message, status=chunk.error.status, field=chunk.error.field)
                if chunk.done:
                    return
                yield chunk.text
        except (aiohttp.ClientError, TimeoutError) as e:
            raise ParrotError(f"the variable stream broke: {type(e).__name__}: {e}", status=503) from e
        finally:
            resp.release()
        raise ParrotError("the variable stream ended without a last line", status=502)

    async def cancel_call(self, call_id: str) -> None:
        _checked(await self._request("DELETE", self._path(f"/calls/{call_id}"), headers=self._headers))

    async def list_variables(self) -> VariableList:
        resp = await self._request("GET", self._path("/variables"), headers=self._headers)
        return VariableList.model_validate(_checked(resp))

    def _path(self, tail: str) -> str:
        return f"/v1/sessions/{self.session_id}{tail}"


def _env_proxy(url: str) -> str | None:
    """The proxy the environment names for `url` (`HTTP_PROXY` / `HTTPS_PROXY`, unless `NO_PROXY`
    covers its host), read once per loop while its sessions are open (`_Connections`): aiohttp's
    `trust_env` reads it (and ~/.netrc) at every request, 0.37 ms of CPU each (0.65 against 0.28 ms
    a GET, measured on a 2-core AMD EPYC)."""
    parts = urlsplit(url)
    if urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return urllib.request.getproxies().get(parts.scheme)


def _is_parrot_error(answer: _Answer) -> bool:
    """The answer is the manager's own error body (ParrotError.to_dict), not a proxy's."""
    try:
        body = answer.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    error = body.get("error") if isinstance(body, dict) else None
    return isinstance(error, dict) and error.get("status") == answer.status


def _checked(answer: _Answer) -> Any:
    if answer.status >= 400:
        try:
            body = answer.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = {"detail": answer.body.decode(errors="replace") or f"HTTP {answer.status}"}
        raise ParrotError.from_dict(body, answer.status)
    return answer.json() if answer.body else None


def _key_header(api_key: str | None) -> dict[str, str]:
    """The tenant's key as a bearer credential; none without a key (a manager with no keys
    configured takes requests without one)."""
    return {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
