"""The HTTP edge shared by every route: error bodies, the body-size limit, bearer credentials.

Every error answer has the body `{"error": {"message", "field", "status", "type", "param"}}`:
ParrotError's own shape plus the two keys OpenAI clients read, so one shape serves both APIs.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import re
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from parrot.protocol.errors import ParrotError

bearer_scheme = HTTPBearer(auto_error=False)
T = TypeVar("T")
# A JSON escape of a UTF-16 surrogate: half of a pair (an emoji escaped by an ASCII-only encoder),
# or a lone one, which no UTF-8 text (and so no tokenizer) can hold.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
# Read left to right: an escaped backslash, a high-low pair, or a lone surrogate (the `lone` group).
_ESCAPES = re.compile(
    rb"\\\\|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|(?P<lone>\\u[dD][89a-fA-F][0-9a-fA-F]{2})"
)


class BodyError(HTTPException):
    """A request body refused while it is read (before any route sees it), naming its field."""

    def __init__(self, status: int, message: str, field: str) -> None:
        super().__init__(status, message)
        self.field = field


def error_body(error: ParrotError) -> dict[str, Any]:
    body = error.to_dict()
    inner = body["error"]
    assert isinstance(inner, dict)
    inner["type"] = "invalid_request_error" if error.status < 500 else "server_error"
    inner["param"] = error.field
    return body


def error_response(error: ParrotError) -> JSONResponse:
    headers = None if error.retry_after_s is None else {"Retry-After": str(max(1, math.ceil(error.retry_after_s)))}
    return JSONResponse(error_body(error), status_code=error.status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    async def on_parrot_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ParrotError)
        return error_response(exc)

    async def on_validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path", "header")]
        field = ".".join(loc) or None
        message = f"{field}: {first.get('msg')}" if field else str(first.get("msg"))
        return error_response(ParrotError(message, status=400, field=field))

    async def on_http_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, HTTPException)
        field = exc.field if isinstance(exc, BodyError) else None
        response = error_response(ParrotError(str(exc.detail), status=exc.status_code, field=field))
        response.headers.update(exc.headers or {})  # a 405's Allow names the methods the path takes
        return response

    app.add_exception_handler(ParrotError, on_parrot_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(HTTPException, on_http_error)


class BodyLimitMiddleware:
    """Refuses request bodies over `max_body_bytes` with 413 naming the limit (declared length or
    counted while streaming in), and JSON bodies with a string that is not Unicode text (a lone
    surrogate escape, `"\\ud800"`: valid JSON, but no tokenizer takes it) with 400 naming the field,
    as the route reads the body. The whole body's bytes are scanned once; only a body with an
    unpaired surrogate escape is parsed here, on a worker thread (an escaped emoji's pair passes)."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        message = f"request body is larger than the limit of {self.max_body_bytes} bytes"
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max_body_bytes:
                body = json.dumps(error_body(ParrotError(message, status=413, field="body"))).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 413,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        num_received = 0
        chunks: list[bytes] = []  # held until the last: a surrogate escape may straddle chunks

        async def counted_receive() -> Message:
            nonlocal num_received
            msg = await receive()
            if msg["type"] == "http.request":
                chunk = msg.get("body", b"")
                num_received += len(chunk)
                if num_received > self.max_body_bytes:
                    # FastAPI re-raises HTTPException from body reading; our handler names the limit.
                    raise BodyError(413, message, "body")
                chunks.append(chunk)
                if not msg.get("more_body", False):
                    body = b"".join(chunks)
                    chunks.clear()
                    if _SURROGATE_ESCAPE.search(body) and any(m.group("lone") for m in _ESCAPES.finditer(body)):
                        await asyncio.to_thread(check_text, body)  # which field: parsed off the loop
            return msg

        await self.app(scope, counted_receive, send)


def check_text(body: bytes) -> None:
    """BodyError(400) naming a string of a JSON body that is not Unicode text (an object's keys are
    checked before its values; a key that is not text names the object holding it); a body that is
    not JSON is left to the route."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return
    stack: list[tuple[str, Any]] = [("body", doc)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str) and not _is_text(value):
            raise BodyError(400, f"{path}: text with a lone UTF-16 surrogate (not Unicode text)", path)
        if isinstance(value, dict):
            for key in value:
                if not _is_text(key):
                    raise BodyError(400, f"{path}: a key with a lone UTF-16 surrogate (not Unicode text)", path)
            items = list(value.items())
        elif isinstance(value, list):
            items = list(enumerate(value))
        else:
            continue
        prefix = "" if path == "body" else f"{path}."
        stack.extend((f"{prefix}{key}", item) for key, item in reversed(items))


def _is_text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


async def bearer_token(
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> str | None:
    return None if credentials is None else credentials.credentials


BearerToken = Annotated[str | None, Depends(bearer_token)]


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """`work`'s result, unless the client disconnects first: then `work` is cancelled (the waits
    and the engine work behind it end) and ParrotError(499) is raised (nobody reads the answer)."""
    done = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({done, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (done, watch):
            task.cancel()
        await asyncio.gather(done, watch, return_exceptions=True)
    if done.cancelled():
        raise ParrotError("the client disconnected", status=499)
    return done.result()


def require_bearer(secret: str, path_prefix: str) -> Callable[[Request, Any], Awaitable[Any]]:
    """HTTP middleware: requests under `path_prefix` need `Authorization: Bearer <secret>` (401
    naming `authorization` otherwise; compared in constant time, never logged)."""
    expected = f"Bearer {secret}".encode()

    async def check(request: Request, call_next: Any) -> Any:
        if request.url.path.startswith(path_prefix):
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                error = ParrotError("missing or wrong engine secret", status=401, field="authorization")
                return error_response(error)
        return await call_next(request)

    return check


def document_errors(app: FastAPI, error_schema: type[BaseModel]) -> None:
    """Make the app's OpenAPI document say what it sends: FastAPI documents a 422 for request
    validation on every route, but the handlers here answer 400 with `error_schema`'s body."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
            name = error_schema.__name__
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    responses = operation.get("responses", {})
                    if responses.pop("422", None) is not None:
                        responses.setdefault(
                            "400",
                            {
                                "description": "Bad request: the message names the field and the limit",
                                "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}},
                            },
                        )
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for unused in ("HTTPValidationError", "ValidationError"):
                components.pop(unused, None)
            if name not in components:
                defs = error_schema.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(defs.pop("$defs", {}))
                components[name] = defs
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
