"""The OpenAPI documents say what the servers send: no 422 (validation errors are 400s with the
error body), and every error body the servers produce validates against the published schema."""

from __future__ import annotations

import json

import httpx
from live_server import LiveServer

from parrot.engine.async_engine import AsyncEngine
from parrot.engine.server.app import create_engine_app
from parrot.protocol.public_api import ErrorResponse
from parrot.web.server_thread import ServerThread


def check_document(doc: dict[str, object]) -> None:
    text = json.dumps(doc)
    assert '"422"' not in text and "HTTPValidationError" not in text
    paths = doc["paths"]
    assert isinstance(paths, dict)
    posts = [op for path in paths.values() for method, op in path.items() if method == "post"]
    assert posts and all("400" in op["responses"] for op in posts)
    assert "ErrorResponse" in doc["components"]["schemas"]  # type: ignore[index]


def test_the_managers_document_and_error_bodies(server: LiveServer) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        check_document(http.get("/openapi.json").json())
        key = {"Authorization": "Bearer k"}
        for resp in (
            http.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": "many"}, headers=key),
            http.post("/v1/completions", json={"model": "nope", "prompt": "x"}, headers=key),
            http.get("/v1/sessions/s-1"),
        ):
            assert resp.status_code in (400, 401, 404)
            ErrorResponse.model_validate(resp.json())


def test_the_engines_document_and_error_bodies(tiny_engine: AsyncEngine) -> None:
    with ServerThread(create_engine_app(tiny_engine)) as srv, httpx.Client(base_url=srv.url, timeout=30) as http:
        check_document(http.get("/openapi.json").json())
        bad = http.post("/v1/engine/extend", json={"context_id": "", "token_ids": [1]})
        assert bad.status_code == 400
        ErrorResponse.model_validate(bad.json())


def test_a_wrong_method_is_a_405_naming_the_allowed_ones(server: LiveServer) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        for method, path, allowed in [("PATCH", "/v1/sessions", "POST"), ("DELETE", "/v1/models", "GET")]:
            resp = http.request(method, path)
            assert [resp.status_code, resp.headers.get("allow")] == [405, allowed]
            assert ErrorResponse.model_validate(resp.json()).error.status == 405


def test_request_bodies_take_strict_types(server: LiveServer) -> None:
    """`true` is not 1 and "5" is not 5: the document's types are the ones the server takes."""
    with httpx.Client(base_url=server.url, timeout=30) as http:
        key = {"Authorization": "Bearer k"}
        for field, value in [("max_tokens", True), ("max_tokens", "5"), ("temperature", False)]:
            body = {"model": "tiny", "prompt": "x", field: value}
            resp = http.post("/v1/completions", json=body, headers=key)
            assert [resp.status_code, resp.json()["error"]["field"]] == [400, field]
