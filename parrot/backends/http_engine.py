"""The engine API over HTTP: the client of a Parrot engine server (`parrot engine`, parrot/engine/server)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from parrot.backends.http_client import TRANSPORT_ERRORS, LazyClient
from parrot.protocol.engine_api import (
    EngineStats,
    ExtendRequest,
    FreeContextRequest,
    LeaseRequest,
    TokenEvent,
)
from parrot.protocol.errors import ParrotError
from parrot.protocol.framing import text_lines


class HttpEngineClient:
    """The engine API over HTTP (`/v1/engine/*`); one pooled connection set per engine."""

    def __init__(self, base_url: str, timeout_s: float = 600.0, secret: str | None = None) -> None:
        """`secret`: the engine server's shared secret (`PARROT_ENGINE_SECRET`), sent as a bearer token."""
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {secret}"} if secret else None
        self._http = LazyClient(self.base_url, timeout_s, headers)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def extend(self, req: ExtendRequest) -> AsyncIterator[TokenEvent]:
        url = f"{self.base_url}/v1/engine/extend"
        try:
            async with self._http.session().post(url, json=req.model_dump(mode="json")) as resp:
                if resp.status >= 400:
                    raise _error(resp.status, await resp.read())
                async for line in text_lines(resp.content.iter_any()):
                    if line.strip():
                        yield TokenEvent.model_validate_json(line)
        except TRANSPORT_ERRORS as e:
            raise self._http.unavailable(e) from e

    async def free(self, req: FreeContextRequest) -> None:
        await self._post("/v1/engine/free", req.model_dump(mode="json"))

    async def stats(self) -> EngineStats:
        return EngineStats.model_validate(await self._get("/v1/engine/stats"))

    async def renew_lease(self, req: LeaseRequest) -> None:
        await self._post("/v1/engine/lease", req.model_dump(mode="json"))

    async def info(self) -> dict[str, Any]:
        """{"model", "model_folder", "max_model_len"} of the engine."""
        return dict(await self._get("/v1/engine/info"))

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        return await self._request("POST", path, body)

    async def _get(self, path: str) -> Any:
        return await self._request("GET", path)

    async def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            async with self._http.session().request(method, f"{self.base_url}{path}", json=body) as resp:
                status, content = resp.status, await resp.read()
        except TRANSPORT_ERRORS as e:
            raise self._http.unavailable(e) from e
        if status >= 400:
            raise _error(status, content)
        return json.loads(content) if content else None


def _error(status: int, content: bytes) -> ParrotError:
    try:
        body = json.loads(content)
    except (json.JSONDecodeError, UnicodeDecodeError):
        body = {"detail": content.decode(errors="replace") or f"HTTP {status}"}
    return ParrotError.from_dict(body, status)
