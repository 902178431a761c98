"""The public HTTP API as async Python calls (one httpx client per session).

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
import functools
import json
import ssl
from collections.abc import AsyncIterator
from typing import Any

import httpx

from parrot.protocol.errors import ParrotError
from parrot.protocol.objective import Criteria
from parrot.protocol.public_api import (
    CreateSessionRequest,
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


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """httpx's default verifying context, built once: building it loads the CA bundle (~25 ms of CPU),
    which a client per session (one per request, in a GPTs-style app) paid at every session."""
    return httpx.create_ssl_context()


class ApiTransport:
    def __init__(self, base_url: str, timeout_s: float = 660.0, max_retries: int = 4, backoff_s: float = 0.25) -> None:
        self.base_url = base_url.rstrip("/")
        timeout = httpx.Timeout(timeout_s, connect=10.0)
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, verify=_tls_context())
        self._headers: dict[str, str] = {}
        self.session_id = ""
        self.num_submits = 0  # batches sent (thousands of calls take a handful)
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.num_retries = 0  # requests sent again after a transient fault

    async def _request(self, method: str, path: str, stream: bool = False, **kw: Any) -> httpx.Response:
        """One request, retried on transient faults (module docstring); ParrotError(503) if the
        manager stays unreachable. `stream`: the body is left unread (the caller closes it)."""
        idempotent = method in ("GET", "DELETE")
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            delay = min(_MAX_BACKOFF_S, self.backoff_s * 2**attempt)
            try:
                resp = await self._http.send(self._http.build_request(method, path, **kw), stream=stream)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:  # never reached the server
                if last:
                    raise ParrotError(f"cannot reach the manager at {self.base_url}: {e}", status=503) from e
            except httpx.TransportError as e:  # may have reached it
                if last or not idempotent:
                    raise ParrotError(
                        f"the connection to the manager failed: {type(e).__name__}: {e}", status=503
                    ) from e
            else:
                status = resp.status_code
                if stream and status in _RETRY_STATUSES:
                    await resp.aread()  # an error body, short: read to tell the manager's from a proxy's
                refused = status in (429, 503) and _is_parrot_error(resp)  # nothing was applied
                if last or status not in _RETRY_STATUSES or not (idempotent or refused):
                    return resp
                await resp.aclose()
                retry_after = resp.headers.get("retry-after", "")
                delay = min(_MAX_BACKOFF_S, float(retry_after)) if retry_after.isdigit() else delay
            self.num_retries += 1
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        await self._http.aclose()

    async def create_session(self, api_key: str, idle_timeout_s: float | None) -> SessionCreated:
        body = CreateSessionRequest(idle_timeout_s=idle_timeout_s).model_dump(mode="json")
        resp = await self._request("POST", "/v1/sessions", json=body, headers={"Authorization": f"Bearer {api_key}"})
        created = SessionCreated.model_validate(_checked(resp))
        self.session_id = created.session_id
        self._headers = {"Authorization": f"Bearer {created.token}"}
        return created

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
            timeout=httpx.Timeout(timeout_s + 30.0, connect=10.0),
        )
        return VariableValue.model_validate(_checked(resp))

    async def stream_variable(self, var_id: str, criteria: Criteria) -> AsyncIterator[str]:
        path = self._path(f"/variables/{var_id}/stream")
        params = {"criteria": criteria.value}
        resp = await self._request("GET", path, stream=True, params=params, headers=self._headers)
        try:
            if resp.status_code >= 400:
                await resp.aread()
                _checked(resp)
            async for line in resp.aiter_lines():
                if not line.strip():
                    continue
                chunk = StreamChunk.model_validate_json(line)
                if chunk.error is not None:
                    raise ParrotError(chunk.error.message, status=chunk.error.status, field=chunk.error.field)
                if chunk.done:
                    return
                yield chunk.text
        finally:
            await resp.aclose()
        raise ParrotError("the variable stream ended without a last line", status=502)

    async def cancel_call(self, call_id: str) -> None:
        _checked(await self._request("DELETE", self._path(f"/calls/{call_id}"), headers=self._headers))

    async def list_variables(self) -> VariableList:
        resp = await self._request("GET", self._path("/variables"), headers=self._headers)
        return VariableList.model_validate(_checked(resp))

    def _path(self, tail: str) -> str:
        return f"/v1/sessions/{self.session_id}{tail}"


def _is_parrot_error(resp: httpx.Response) -> bool:
    """The answer is the manager's own error body (ParrotError.to_dict), not a proxy's."""
    try:
        body = resp.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    error = body.get("error") if isinstance(body, dict) else None
    return isinstance(error, dict) and error.get("status") == resp.status_code


def _checked(resp: httpx.Response) -> Any:
    if resp.status_code >= 400:
        try:
            body = resp.json()
        except json.JSONDecodeError:
            body = {"detail": resp.text or resp.reason_phrase}
        raise ParrotError.from_dict(body, resp.status_code)
    return resp.json() if resp.content else None
