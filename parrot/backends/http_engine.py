"""The engine API over HTTP: the client of a Parrot engine server (`parrot engine`, parrot/engine/server)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from parrot.protocol.engine_api import (
    EngineStats,
    FillRequest,
    FillResult,
    FreeContextRequest,
    GenerateRequest,
    LeaseRequest,
    TokenEvent,
)
from parrot.protocol.engine_client import EngineUnavailable
from parrot.protocol.errors import ParrotError


class HttpEngineClient:
    """The engine API over HTTP (`/v1/engine/*`); one pooled connection set per engine."""

    def __init__(self, base_url: str, timeout_s: float = 600.0, secret: str | None = None) -> None:
        """`secret`: the engine server's shared secret (`PARROT_ENGINE_SECRET`), sent as a bearer token."""
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {secret}"} if secret else None
        self._http = httpx.AsyncClient(
            base_url=self.base_url, timeout=httpx.Timeout(timeout_s, connect=10.0), headers=headers
        )

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

    async def renew_lease(self, req: LeaseRequest) -> None:
        await self._post("/v1/engine/lease", req.model_dump(mode="json"))

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
