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
from parrot.serve.http.engines import router as engines_router
from parrot.serve.http.openai_routes import router as openai_router
from parrot.serve.http.sessions import router as sessions_router
from parrot.serve.manager import Manager
from parrot.web.edge import BodyLimitMiddleware, install_error_handlers


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
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=manager.config.max_body_bytes)
    app.include_router(sessions_router)
    app.include_router(openai_router)
    app.include_router(engines_router)

    @app.get("/health", tags=["health"])
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    return app
