"""The engine's HTTP server: the engine API (Extend / Free / Lease / stats) over FastAPI.

Routes (JSON bodies are the parrot.protocol.engine_api models):
    POST /v1/engine/extend        ExtendRequest -> NDJSON stream of TokenEvent, one per line (an
                                  extend without sampling: one line, once its tokens are computed)
    POST /v1/engine/free          FreeContextRequest -> {}
    POST /v1/engine/lease         LeaseRequest -> {} (hold contexts by id prefix; expired: freed when idle)
    GET  /v1/engine/stats         EngineStats
    GET  /v1/engine/info          {"model", "model_folder", "max_model_len"}
    GET  /health
    GET  /metrics                 Prometheus text format (metrics.py; open, as /health)
Errors: the manager's error body and statuses (parrot/web/edge.py): {"error": {"message", "field",
"status", "type", "param"}}; a request that fails validation is a 400 naming the field, a body
over MAX_BODY_BYTES a 413.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Response
from fastapi.responses import StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from parrot.engine.async_engine import AsyncEngine
from parrot.engine.server.metrics import EngineMetrics
from parrot.protocol.engine_api import (
    EngineStats,
    ExtendRequest,
    FreeContextRequest,
    LeaseRequest,
    TokenEvent,
)
from parrot.protocol.public_api import ErrorResponse
from parrot.web.edge import BodyLimitMiddleware, document_errors, install_error_handlers, require_bearer

MAX_BODY_BYTES = 16 << 20
# What the routes answer besides 200 and 400 (documented for every route by `document_errors`).
_ERROR: dict[str, Any] = {"model": ErrorResponse}
# 401 without the secret, 413 over the body limit, 503 while stopping; 404 an unknown context or
# parent, 409 a context in the way.
_ALWAYS: dict[int | str, dict[str, Any]] = {401: _ERROR, 413: _ERROR, 503: _ERROR}
_CONTEXT: dict[int | str, dict[str, Any]] = {**_ALWAYS, 404: _ERROR, 409: _ERROR}


def create_engine_app(engine: AsyncEngine, secret: str | None = None) -> FastAPI:
    """The engine API over HTTP. With `secret`, every /v1/engine route needs `Authorization:
    Bearer <secret>` (401 otherwise; compared in constant time): only its manager reaches it."""
    app = FastAPI(title="Parrot engine", version="0.1.0")
    install_error_handlers(app)
    document_errors(app, ErrorResponse)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=MAX_BODY_BYTES)
    if secret:
        app.middleware("http")(require_bearer(secret, "/v1/engine/"))
    metrics = app.state.metrics = EngineMetrics()

    @app.post(
        "/v1/engine/extend",
        responses={**_CONTEXT, 200: {"content": {"application/x-ndjson": {"schema": TokenEvent.model_json_schema()}}}},
    )
    async def extend(req: ExtendRequest) -> StreamingResponse:
        events = engine.extend(req)
        if req.sampling is not None:  # generations are timed; an extend without sampling has no tokens out
            events = metrics.observe(req.objective.value, events)
        # Pull the first event before answering, so submission errors become a 4xx, not a stream.
        first = await anext(events)

        async def lines() -> AsyncIterator[bytes]:
            yield first.model_dump_json().encode() + b"\n"
            async for event in events:
                yield event.model_dump_json().encode() + b"\n"

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    @app.post("/v1/engine/free", responses={**_ALWAYS, 404: _ERROR})  # busy: freed when idle
    async def free(req: FreeContextRequest) -> dict[str, str]:
        await engine.free(req)
        return {}

    @app.post("/v1/engine/lease", responses=_ALWAYS)
    async def lease(req: LeaseRequest) -> dict[str, str]:
        engine.leases.renew(req)
        return {}

    @app.get("/v1/engine/stats", responses=_ALWAYS)
    async def stats() -> EngineStats:
        metrics.heartbeats.inc()
        return await engine.stats()

    @app.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(await engine.stats()), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/engine/info", responses=_ALWAYS)
    async def info() -> dict[str, object]:
        return {
            "model": engine.model_name,
            "model_folder": str(engine.model_folder),
            "max_model_len": engine.max_model_len,
        }

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return app
