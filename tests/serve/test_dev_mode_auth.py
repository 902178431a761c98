"""Development mode (no API keys configured) takes requests without an `Authorization` header, over
HTTP on the public API, the OpenAI routes and the SDK; with keys configured a missing header is a
401 naming `authorization`. Against a real manager on loopback (the tiny engine)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from live_server import LiveServer, live_server

from parrot.engine.async_engine import AsyncEngine
from parrot.frontend import Input, Output, SamplingParams, Session, semantic_function
from parrot.protocol.errors import ParrotError
from parrot.serve import ManagerConfig
from parrot.serve.config import AuthConfig
from parrot.serve.runtime.session import ANONYMOUS_TENANT

SHORT = {"max_tokens": 3, "ignore_eos": True}
BATCH = {
    "calls": [
        {"template": "Say {{input:x}}:{{output:y}}", "bindings": {"x": {"value": "hi"}}, "default_sampling": SHORT}
    ]
}


@semantic_function(sampling=SamplingParams(max_tokens=3, ignore_eos=True))
def echo(x: Input, y: Output):  # type: ignore[no-untyped-def]
    """Say {{input:x}}:{{output:y}}"""


@pytest.fixture
def keyed_server(tiny_engine: AsyncEngine) -> Iterator[LiveServer]:
    with live_server(tiny_engine, ManagerConfig(auth=AuthConfig(api_keys=("good-key",)))) as srv:
        yield srv


def test_dev_mode_public_api_without_a_header(server: LiveServer) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as http:
        created = http.post("/v1/sessions", json={"submit": BATCH})
        assert created.status_code == 201, created.text
        sid = created.json()["session_id"]
        assert server.manager.sessions.sessions[sid].tenant == ANONYMOUS_TENANT
        # A session opened without a key is reached by its id alone.
        value = http.get(f"/v1/sessions/{sid}/variables/c0~y")
        assert value.status_code == 200 and value.json()["state"] == "ready"
        assert http.get(f"/v1/sessions/{sid}").json()["num_calls_done"] == 1
        assert [s["session_id"] for s in http.get("/v1/sessions").json()["sessions"]] == [sid]
        assert http.delete(f"/v1/sessions/{sid}").status_code == 204

        # A session opened with a key still needs its token.
        keyed = http.post("/v1/sessions", headers={"Authorization": "Bearer k"}).json()
        refused = http.get(f"/v1/sessions/{keyed['session_id']}")
        assert refused.status_code == 401 and refused.json()["error"]["param"] == "authorization"
        assert http.get("/v1/sessions/s-nope").status_code == 404
        http.delete(f"/v1/sessions/{keyed['session_id']}", headers={"Authorization": f"Bearer {keyed['token']}"})

        ran = http.post("/v1/run", json={"submit": BATCH})
        assert ran.status_code == 200, ran.text
        assert [v["state"] for v in ran.json()["values"]] == ["ready"]
        assert http.get("/v1/status").status_code == 200
        assert http.get("/v1/engines").status_code == 200


def test_dev_mode_openai_routes_without_a_header(server: LiveServer) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as http:
        models = http.get("/v1/models")
        assert models.status_code == 200 and [m["id"] for m in models.json()["data"]] == ["tiny"]
        done = http.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2})
        assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] <= 2
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
        replied = http.post("/v1/chat/completions", json=chat)
        assert replied.status_code == 200 and replied.json()["object"] == "chat.completion"


def test_dev_mode_sdk_without_a_key(server: LiveServer) -> None:
    with Session(server.url) as s:
        out = echo("hi")
        assert len(out.get()) > 0
        assert server.manager.sessions.sessions[s.session_id].tenant == ANONYMOUS_TENANT


def test_with_keys_a_missing_header_is_401(keyed_server: LiveServer) -> None:
    with httpx.Client(base_url=keyed_server.url, timeout=60) as http:
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
        answers = [
            http.post("/v1/sessions"),
            http.post("/v1/run", json={"submit": BATCH}),
            http.get("/v1/sessions"),
            http.get("/v1/models"),
            http.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2}),
            http.post("/v1/chat/completions", json=chat),
            http.get("/v1/status"),
        ]
        assert [(r.status_code, r.json()["error"]["param"]) for r in answers] == [(401, "authorization")] * 7
        created = http.post("/v1/sessions", headers={"Authorization": "Bearer good-key"}).json()
        tokenless = http.get(f"/v1/sessions/{created['session_id']}")
        assert tokenless.status_code == 401
        assert tokenless.json()["error"]["message"] == "missing session token: send `Authorization: Bearer <token>`"
        http.delete(f"/v1/sessions/{created['session_id']}", headers={"Authorization": f"Bearer {created['token']}"})
    s = Session(keyed_server.url)
    try:
        with pytest.raises(ParrotError) as refused:
            s.open()
        assert (refused.value.status, refused.value.field) == (401, "authorization")
        assert refused.value.message == "missing API key: send `Authorization: Bearer <key>`"
    finally:
        s.close()
    assert keyed_server.manager.sessions.sessions == {}
