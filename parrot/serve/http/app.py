"""The manager's web app: the public Semantic Variable API and the OpenAI-compatible routes.

`create_app(manager)` returns a FastAPI app whose lifespan starts and stops the manager; serve it
with uvicorn (the launcher does). The OpenAPI schema is at /openapi.json, the docs at /docs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

import parrot
from parrot.protocol.engine_client import EngineConnector
from parrot.protocol.errors import ParrotError
from parrot.protocol.public_api import ErrorResponse
from parrot.serve.http.engines import router as engines_router
from parrot.serve.http.openai import router as openai_router
from parrot.serve.http.ops import router as ops_router
from parrot.serve.http.sessions import router as sessions_router
from parrot.serve.http.sessions import runs_router
from parrot.serve.manager import Manager
from parrot.web.edge import BodyLimitMiddleware, document_errors, install_error_handlers


def create_app(
    manager: Manager, *, connect_engine: EngineConnector | None = None, manage_lifespan: bool = True
) -> FastAPI:
    """The app over `manager`. With `manage_lifespan` (default) the app's startup runs
    `await manager.start()` and its shutdown `await manager.stop()`; pass False when the caller
    starts and stops the manager itself. `connect_engine` builds clients for engines registered
    while serving (`POST /v1/engines`); without one that route answers 501."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if manage_lifespan:
            await manager.start()
        try:
            yield
        finally:
            if manage_lifespan:
                await manager.stop()

    app = FastAPI(
        title="Parrot",
        version=parrot.__version__,
        summary="Serving LLM-based applications with Semantic Variables",
        lifespan=lifespan,
    )
    app.state.manager = manager
    app.state.connect_engine = connect_engine
    install_error_handlers(app)
    document_errors(app, ErrorResponse)
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=manager.config.limits.max_body_bytes)
    app.include_router(sessions_router)
    app.include_router(runs_router)
    app.include_router(openai_router)
    app.include_router(engines_router)
    app.include_router(ops_router)

    @app.get("/health", tags=["health"])
    async def health() -> dict[str, str]:
        """Liveness: the manager answers (engines may all be dead; see /ready)."""
        return {"status": "ok"}

    @app.get("/ready", tags=["health"], responses={503: {"model": ErrorResponse}})
    async def ready() -> dict[str, object]:
        """Readiness: at least one live engine (503 otherwise, as every route that needs one)."""
        alive = manager.pool.alive
        if not alive:
            raise ParrotError("no live engine: every engine is dead or removed", status=503)
        return {"status": "ready", "num_live_engines": len(alive), "models": manager.pool.models}

    return app
