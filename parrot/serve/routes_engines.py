"""Operator routes: list the engines and register new ones while serving.

`POST /v1/engines {"url": ...}` connects to an engine server by URL (its model, context length and
tokenizer are read from it); from then on the manager sends it heartbeats and calls.
`{"url": ..., "kind": "openai", "model": ..., "tokenizer": ...}` attaches any OpenAI-compatible
completion server (vLLM) through the adapter (openai_engine.py); `tokenizer` is a folder on the
manager's machine. `GET /v1/engines` shows each engine's liveness, load, calibrated latency cap and
cached prefixes. Both need an accepted API key.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter

from parrot.protocol.errors import ParrotError
from parrot.protocol.public_api import EngineInfo, EngineList, ErrorResponse, RegisterEngineRequest
from parrot.serve.engine_client import EngineUnavailable, HttpEngineClient
from parrot.serve.engines import EngineHandle
from parrot.serve.http_edge import BearerToken
from parrot.serve.manager import Manager
from parrot.serve.openai_engine import OpenAIEngineClient
from parrot.serve.routes_sessions import ManagerDep

_ERRORS: dict[int | str, dict[str, object]] = {code: {"model": ErrorResponse} for code in (400, 401, 409)}
router = APIRouter(prefix="/v1/engines", tags=["engines"], responses=_ERRORS)


@router.get("", response_model=EngineList)
async def list_engines(api_key: BearerToken, manager: ManagerDep) -> EngineList:
    manager.sessions.tenant_of(api_key)
    return EngineList(engines=[_info(manager, h) for h in manager.pool.handles.values()])


@router.post("", status_code=201, response_model=EngineInfo)
async def register_engine(req: RegisterEngineRequest, api_key: BearerToken, manager: ManagerDep) -> EngineInfo:
    """Connect to an engine server and start scheduling calls onto it."""
    manager.sessions.tenant_of(api_key)
    client = _client(req)
    try:
        if isinstance(client, OpenAIEngineClient):
            await _check_upstream(client, manager)
        handle = await manager.add_engine(client, req.max_running_calls, url=req.url)
    except BaseException:
        await client.aclose()
        raise
    return _info(manager, handle)


def _client(req: RegisterEngineRequest) -> HttpEngineClient | OpenAIEngineClient:
    if req.kind == "parrot":
        for name in ("model", "tokenizer", "api_key", "max_model_len"):
            if getattr(req, name) is not None:
                raise ParrotError(f"{name} is for kind 'openai': a Parrot engine says its own", field=name)
        return HttpEngineClient(req.url)
    if req.tokenizer is not None and not (Path(req.tokenizer) / "tokenizer.json").is_file():
        raise ParrotError(f"no tokenizer.json in {req.tokenizer!r} on the manager's machine", field="tokenizer")
    return OpenAIEngineClient(req.url, req.model, req.api_key, req.tokenizer, req.max_model_len)


async def _check_upstream(client: OpenAIEngineClient, manager: Manager) -> None:
    """Ask the upstream for its model card now, so each fault names the request field to fix."""
    try:
        info = await client.info()
    except EngineUnavailable as e:
        raise ParrotError(f"cannot reach the upstream: {e.message}", field="url") from e
    except ParrotError as e:
        if e.status in (401, 403):
            raise ParrotError(f"the upstream refused the key: {e.message}", field="api_key") from e
        raise
    if info["model_folder"] is None and manager.pool.tokenizer_folder is None:
        raise ParrotError(
            "the upstream's model card names no folder on this machine: give the model's tokenizer folder",
            field="tokenizer",
        )


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
    )
