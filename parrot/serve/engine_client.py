"""How the manager talks to an engine: the engine API as a Protocol, and its HTTP client.

`EngineClient` is structural: the builtin engine's in-process `AsyncEngine` satisfies it as is (the
embedded mode), and `HttpEngineClient` speaks the same four calls to an engine server by URL.
Errors arrive as ParrotError with the engine's status and field; an engine that does not answer
raises EngineUnavailable.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import httpx

from parrot.protocol.engine_api import (
    EngineStats,
    FillRequest,
    FillResult,
    FreeContextRequest,
    GenerateRequest,
    TokenEvent,
)
from parrot.protocol.errors import ParrotError


class EngineUnavailable(ParrotError):
    """The engine did not answer (connection refused or dropped, timeout): the engine may be dead,
    not the request wrong. The executor re-dispatches the call elsewhere."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=503, field=None)


@runtime_checkable
class EngineClient(Protocol):
    async def fill(self, req: FillRequest) -> FillResult:
        """Extend (or fork and extend) a context; returns its length. Waits for earlier work on it."""
        ...

    def generate(self, req: GenerateRequest) -> AsyncIterator[TokenEvent]:
        """Decode into a context; the last event has finish_reason. Closing the iterator early aborts."""
        ...

    async def free_context(self, req: FreeContextRequest) -> None:
        """Release a context; 409 while work on it is pending."""
        ...

    async def stats(self) -> EngineStats: ...


class HttpEngineClient:
    """The engine API over HTTP (`/v1/engine/*`); one pooled connection set per engine."""

    def __init__(self, base_url: str, timeout_s: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=httpx.Timeout(timeout_s, connect=10.0))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def fill(self, req: FillRequest) -> FillResult:
        return FillResult.model_validate(await self._post("/v1/engine/fill", req.model_dump(mode="json")))

    async def generate(self, req: GenerateRequest) -> AsyncIterator[TokenEvent]:
        try:
            async with self._http.stream("POST", "/v1/engine/generate", json=req.model_dump(mode="json")) as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    raise _error(resp)
                async for line in resp.aiter_lines():
                    if line.strip():
                        yield TokenEvent.model_validate_json(line)
        except httpx.TransportError as e:
            raise self._unavailable(e) from e

    async def free_context(self, req: FreeContextRequest) -> None:
        await self._post("/v1/engine/free_context", req.model_dump(mode="json"))

    async def stats(self) -> EngineStats:
        return EngineStats.model_validate(await self._get("/v1/engine/stats"))

    async def info(self) -> dict[str, Any]:
        """{"model", "model_folder", "max_model_len"} of the engine."""
        return dict(await self._get("/v1/engine/info"))

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        try:
            resp = await self._http.post(path, json=body)
        except httpx.TransportError as e:
            raise self._unavailable(e) from e
        if resp.status_code >= 400:
            raise _error(resp)
        return resp.json() if resp.content else None

    async def _get(self, path: str) -> Any:
        try:
            resp = await self._http.get(path)
        except httpx.TransportError as e:
            raise self._unavailable(e) from e
        if resp.status_code >= 400:
            raise _error(resp)
        return resp.json()

    def _unavailable(self, e: httpx.TransportError) -> EngineUnavailable:
        return EngineUnavailable(f"engine {self.base_url} is unreachable: {type(e).__name__}: {e}")


def _error(resp: httpx.Response) -> ParrotError:
    try:
        body = resp.json()
    except json.JSONDecodeError:
        body = {"detail": resp.text or resp.reason_phrase}
    return ParrotError.from_dict(body, resp.status_code)


async def engine_model_folder(client: EngineClient) -> Path | None:
    """Where the engine's tokenizer lives, if the client can say: its `model_folder` (in-process
    engine, a configured adapter), else the `model_folder` of its `info()` (HTTP engine, adapter)."""
    folder = getattr(client, "model_folder", None)
    info = getattr(client, "info", None)
    if folder is None and info is not None:
        folder = (await info()).get("model_folder")
    return None if folder is None else Path(folder)
