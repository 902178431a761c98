"""The engine's HTTP server: the engine API (Fill / Generate / FreeContext / stats) over FastAPI.

Routes (JSON bodies are the parrot.protocol.engine_api models):
    POST /v1/engine/fill          FillRequest -> FillResult (returns when the fill is computed)
    POST /v1/engine/generate      GenerateRequest -> NDJSON stream of TokenEvent, one per line
    POST /v1/engine/free_context  FreeContextRequest -> {}
    GET  /v1/engine/stats         EngineStats
    GET  /v1/engine/info          {"model", "model_folder", "max_model_len"}
    GET  /health
Errors: {"error": {"message", "field", "status"}} with a 4xx/5xx status; request validation errors
are 422 with the offending field named.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from parrot.engine.async_engine import AsyncEngine
from parrot.protocol.engine_api import EngineStats, FillRequest, FillResult, FreeContextRequest, GenerateRequest
from parrot.protocol.errors import ParrotError

MAX_BODY_BYTES = 16 << 20


def install_error_handlers(app: FastAPI) -> None:
    """ParrotError -> its status; validation errors -> 422 naming the field and the limit."""

    @app.exception_handler(ParrotError)
    async def _parrot_error(_: Request, exc: ParrotError) -> JSONResponse:
        return JSONResponse(exc.to_dict(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        field = ".".join(loc) or None
        msg = f"{field}: {first.get('msg', 'invalid request')}" if field else str(first.get("msg", "invalid body"))
        return JSONResponse(ParrotError(msg, status=422, field=field).to_dict(), status_code=422)

    @app.middleware("http")
    async def _limit_body(request: Request, call_next):  # type: ignore[no-untyped-def]
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
            err = ParrotError(f"request body of {length} bytes exceeds the limit of {MAX_BODY_BYTES}", status=413)
            return JSONResponse(err.to_dict(), status_code=413)
        return await call_next(request)


def create_engine_app(engine: AsyncEngine) -> FastAPI:
    app = FastAPI(title="Parrot engine", version="0.1.0")
    install_error_handlers(app)

    @app.post("/v1/engine/fill")
    async def fill(req: FillRequest) -> FillResult:
        return await engine.fill(req)

    @app.post("/v1/engine/generate")
    async def generate(req: GenerateRequest) -> StreamingResponse:
        events = engine.generate(req)
        # Pull the first event before answering, so submission errors become a 4xx, not a stream.
        first = await anext(events)

        async def lines() -> AsyncIterator[bytes]:
            yield first.model_dump_json().encode() + b"\n"
            async for event in events:
                yield event.model_dump_json().encode() + b"\n"

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    @app.post("/v1/engine/free_context")
    async def free_context(req: FreeContextRequest) -> dict[str, str]:
        await engine.free_context(req)
        return {}

    @app.get("/v1/engine/stats")
    async def stats() -> EngineStats:
        return await engine.stats()

    @app.get("/v1/engine/info")
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
