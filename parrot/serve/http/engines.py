"""Operator routes: list the engines and register new ones while serving.

`POST /v1/engines {"url": ...}` connects to an engine server by URL (its model, context length and
tokenizer are read from it); from then on the manager sends it heartbeats and calls.
`{"url": ..., "kind": "openai", "model": ..., "tokenizer": ...}` attaches any OpenAI-compatible
completion server (vLLM) through the adapter (parrot/backends/openai_engine.py); `tokenizer` is a
folder on the manager's machine. The clients come from the `EngineConnector` the launcher gave
`create_app` (parrot/backends/connect.py): the manager imports no backend. `GET /v1/engines`
shows each engine's liveness, load, calibrated latency cap and cached prefixes. Both need an accepted API key.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from fastapi import APIRouter, Request

from parrot.protocol.engine_client import EngineConnector
from parrot.protocol.errors import ParrotError
from parrot.protocol.public_api import EngineInfo, EngineList, ErrorResponse, RegisterEngineRequest
from parrot.serve.http.deps import ManagerDep
from parrot.serve.manager import Manager
from parrot.serve.runtime.engines import EngineHandle
from parrot.web.edge import BearerToken

_ERRORS: dict[int | str, dict[str, object]] = {code: {"model": ErrorResponse} for code in (400, 401, 403, 409)}
router = APIRouter(prefix="/v1/engines", tags=["engines"], responses=_ERRORS)


@router.get("", response_model=EngineList)
async def list_engines(api_key: BearerToken, manager: ManagerDep) -> EngineList:
    manager.sessions.tenant_of(api_key)
    return EngineList(engines=[_info(manager, h) for h in manager.pool.handles.values()])


@router.post("", status_code=201, response_model=EngineInfo)
async def register_engine(
    req: RegisterEngineRequest, api_key: BearerToken, manager: ManagerDep, request: Request
) -> EngineInfo:
    """Connect to an engine server and start scheduling calls onto it (operators only)."""
    manager.sessions.require_operator(api_key)
    check_engine_url(req.url, manager.config.auth.engine_url_allowlist)
    connect: EngineConnector | None = request.app.state.connect_engine
    if connect is None:
        raise ParrotError("this manager was started without engine registration", status=501, field="url")
    client = await connect(req, has_tokenizer=manager.pool.tokenizer_folder is not None)
    try:
        handle = await manager.add_engine(client, req.max_running_calls, url=req.url)
    except BaseException:
        aclose = getattr(client, "aclose", None)
        if aclose is not None:
            await aclose()
        raise
    return _info(manager, handle)


@router.delete("/{engine_id}", response_model=EngineInfo, responses={404: {"model": ErrorResponse}})
async def remove_engine(engine_id: str, api_key: BearerToken, manager: ManagerDep) -> EngineInfo:
    """Stop scheduling onto an engine (operators only): its calls continue on the others."""
    manager.sessions.require_operator(api_key)
    return _info(manager, await manager.remove_engine(engine_id))


def check_engine_url(url: str, allowlist: tuple[str, ...]) -> None:
    """An http(s) URL with a host, under one of `allowlist`'s prefixes when there is one; 400 naming `url`."""
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises on a port that is not a number or out of range
    except ValueError as e:
        raise ParrotError(f"url {url!r} is not a valid URL: {e}", field="url") from e
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ParrotError(f"url {url!r} must be http:// or https:// with a host", field="url")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ParrotError(f"url {url!r} must have no credentials, query or fragment", field="url")
    if allowlist and not any(url.startswith(prefix) for prefix in allowlist):
        raise ParrotError(f"url {url!r} is not under an allowed engine URL ({len(allowlist)} configured)", field="url")


def _info(manager: Manager, h: EngineHandle) -> EngineInfo:
    return EngineInfo(
        engine_id=h.engine_id,
        url=h.url,
        model=h.model,
        alive=h.alive,
        num_running_calls=h.num_running_calls,
        num_latency_calls=h.num_latency_calls,
        latency_cap=h.latency_cap,
        num_cached_prefixes=len(manager.prefix_cache.entries(h.engine_id)),
        num_blocks_free=h.stats.num_blocks_free,
        num_blocks_total=h.stats.num_blocks_total,
        num_prefill_tokens=h.stats.num_prefill_tokens,
        num_decode_tokens=h.stats.num_decode_tokens,
        num_reused_tokens=h.stats.num_reused_tokens,
        native_kernels=h.stats.native_kernels,
    )
