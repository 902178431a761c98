"""A JSON body may escape a UTF-16 surrogate that no text can hold (`"\\ud800"`, valid JSON): it is
refused before any route sees it, a 400 naming the field, and nothing reaches the engine; the
session it was sent to stays usable. An escaped emoji (a surrogate pair) and the literal text
`\\ud800` (an escaped backslash) are text and pass."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from live_server import LiveServer
from starlette.types import Message, Receive, Scope, Send

from parrot.web.edge import BodyError, BodyLimitMiddleware

KEY = {"Authorization": "Bearer k", "content-type": "application/json"}


def post(server: LiveServer, path: str, body: str, headers: dict[str, str] = KEY) -> httpx.Response:
    return httpx.post(server.url + path, content=body, headers=headers, timeout=30)


def error_field(resp: httpx.Response) -> tuple[int, str]:
    return resp.status_code, resp.json()["error"]["field"]


def test_a_lone_surrogate_is_a_400_naming_the_field_and_reaches_no_engine(server: LiveServer) -> None:
    lone = '{"model": "tiny", "prompt": "Hi \\ud800 there", "max_tokens": 2}'
    status, field = error_field(post(server, "/v1/completions", lone))
    assert status == 400
    assert field == "prompt"
    chat = (
        '{"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "a parrot \\ud83e\\udd9c"},'
        ' {"role": "user", "content": "\\\\ud800 is literal, this is not: \\udc00"}]}'
    )
    status, field = error_field(post(server, "/v1/chat/completions", chat))
    assert status == 400
    assert field == "messages.1.content"
    status, field = error_field(post(server, "/v1/completions", '{"model": "tiny", "\\udfff": 1, "prompt": "x"}'))
    assert status == 400
    assert field == "body"  # a key: the object that holds it
    assert server.engine.log == []


def test_escaped_pairs_and_an_escaped_backslash_are_text(server: LiveServer) -> None:
    body = '{"model": "tiny", "prompt": "a parrot \\ud83e\\udd9c and \\\\ud800", "max_tokens": 2}'
    resp = post(server, "/v1/completions", body)
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] == 2


def test_a_session_keeps_working_after_a_refused_value(server: LiveServer) -> None:
    created = httpx.post(server.url + "/v1/sessions", headers={"Authorization": "Bearer k"}).json()
    auth = {"Authorization": f"Bearer {created['token']}", "content-type": "application/json"}
    url = f"/v1/sessions/{created['session_id']}/submit"
    call = '{"calls": [{"template": "Say {{input:x}}:{{output:y}}", "bindings": {"x": {"value": "%s"}}}]}'
    status, field = error_field(post(server, url, call % "\\ud800", auth))
    assert status == 400
    assert field == "calls.0.bindings.x.value"
    resp = post(server, url, call % "hello", auth)
    assert resp.status_code == 200, resp.text


def run_middleware(pieces: list[bytes]) -> BodyError | None:
    """The body in `pieces` through BodyLimitMiddleware to an app that reads it all; the refusal."""
    pieces = list(pieces)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        while (await receive()).get("more_body"):
            pass

    async def receive() -> Message:
        chunk = pieces.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(pieces)}

    async def send(message: Message) -> None:
        raise AssertionError(message)

    middleware = BodyLimitMiddleware(app, max_body_bytes=1 << 20)
    try:
        asyncio.run(middleware({"type": "http", "headers": []}, receive, send))
    except BodyError as refused:
        return refused
    return None


BODY = b'{"prompt": "abc \\ud800 def"}'


@pytest.mark.parametrize(
    "pieces",
    [
        [BODY[: BODY.index(b"d800")], BODY[BODY.index(b"d800") :]],  # two pieces, the escape cut
        [BODY[: BODY.index(b"\\")], b"\\", b"u", BODY[BODY.index(b"d800") :]],  # three and more
        [BODY[: BODY.index(b"00 ")], b"", BODY[BODY.index(b"00 ") :]],  # an empty piece between
        [BODY[i : i + 1] for i in range(len(BODY))],  # a byte at a time
    ],
)
def test_an_escape_split_between_body_chunks_is_found(pieces: list[bytes]) -> None:
    assert b"".join(pieces) == BODY
    refused = run_middleware(pieces)
    assert refused is not None
    assert refused.status_code == 400
    assert refused.field == "prompt"


def test_pairs_escaped_backslashes_and_other_bodies_pass_the_scan() -> None:
    for body in (
        b'{"prompt": "a parrot \\ud83e\\udd9c"}',  # a pair
        b'{"prompt": "\\\\ud800 is text"}',  # an escaped backslash, then the letters
        b"not json at all \\ud800",  # not JSON: the route answers it
        b"[" * 100_000 + b'"\\ud800"' + b"]" * 100_000,  # too deep to parse: the route answers it
    ):
        for pieces in ([body], [body[:7], body[7:]]):
            assert run_middleware(pieces) is None, body[:40]
    refused = run_middleware([b'{"a": [{"b": "ok"}, {"c": "\\\\\\ud800"}]}'])  # backslash, then an escape
    assert refused is not None
    assert refused.field == "a.1.c"
