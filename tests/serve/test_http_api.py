"""The public HTTP API on a real server and engine: auth, tenant isolation, refusals that change
nothing, streaming, and session deletion/expiry freeing engine contexts."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from live_server import LiveServer, live_server

from parrot.engine.async_engine import AsyncEngine
from parrot.serve import ManagerConfig
from parrot.serve.config import AuthConfig, LifecycleConfig, LimitsConfig


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


class Client:
    """One session over raw HTTP."""

    def __init__(self, url: str, api_key: str = "k") -> None:
        self.http = httpx.Client(base_url=url, timeout=60)
        created = self.http.post("/v1/sessions", headers=bearer(api_key))
        assert created.status_code == 201, created.text
        self.session_id = created.json()["session_id"]
        self.token = created.json()["token"]
        self.base = f"/v1/sessions/{self.session_id}"

    def post(self, tail: str, body: Any) -> httpx.Response:
        return self.http.post(self.base + tail, json=body, headers=bearer(self.token))

    def get(self, tail: str, **params: Any) -> httpx.Response:
        return self.http.get(self.base + tail, params=params, headers=bearer(self.token))

    def put(self, tail: str, body: Any) -> httpx.Response:
        return self.http.put(self.base + tail, json=body, headers=bearer(self.token))

    def state(self) -> tuple[Any, Any]:
        status = self.get("").json()
        del status["idle_s"]
        # Per-call run state moves on its own (early fills; any get, even one that times out,
        # re-deduces objectives), and so do the engines' token counts (a waiting call's early fill
        # may land after the first look, on a slow machine): the graph's own state is what bad
        # requests must not change.
        status["calls"] = [(c["call_id"], c["name"], c["state"], c["task_group"]) for c in status["calls"]]
        del status["engines"]
        return status, self.get("/variables").json()


def error_of(resp: httpx.Response) -> tuple[int, str | None, str]:
    err = resp.json()["error"]
    assert err["status"] == resp.status_code
    return resp.status_code, err["field"], err["message"]


@pytest.fixture
def small_server(tiny_engine: AsyncEngine) -> Iterator[LiveServer]:
    config = ManagerConfig(
        auth=AuthConfig(api_keys=("good-key", "other-key")), limits=LimitsConfig(max_body_bytes=64_000)
    )
    with live_server(tiny_engine, config) as srv:
        yield srv


def test_openapi_schema_is_published(server: LiveServer) -> None:
    schema = httpx.get(server.url + "/openapi.json").json()
    for path in (
        "/v1/sessions",
        "/v1/sessions/{session_id}/submit",
        "/v1/sessions/{session_id}/variables/{var_id}",
        "/v1/sessions/{session_id}/variables/{var_id}/stream",
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/models",
    ):
        assert path in schema["paths"]
    assert {"CallSpec", "Binding", "SubmitRequest", "VariableValue", "ErrorResponse"} <= set(
        schema["components"]["schemas"]
    )


def test_api_keys_and_session_tokens_are_checked(small_server: LiveServer) -> None:
    http = httpx.Client(base_url=small_server.url)
    assert error_of(http.post("/v1/sessions"))[:2] == (401, "authorization")
    assert error_of(http.post("/v1/sessions", headers=bearer("bad-key")))[:2] == (401, "authorization")
    assert error_of(http.get("/v1/models", headers=bearer("bad-key")))[0] == 401
    a = Client(small_server.url, "good-key")
    b = Client(small_server.url, "other-key")
    assert a.post("/variables", {"var_id": "secret", "value": "A's text"}).status_code == 201
    secret = f"{a.base}/variables/secret"
    assert error_of(http.get(secret))[:2] == (401, "authorization")
    assert error_of(http.get(secret, headers=bearer("pst-forged")))[:2] == (401, "authorization")
    # B's token on A's session: refused, whatever the verb.
    assert error_of(http.get(secret, headers=bearer(b.token)))[:2] == (403, "session_id")
    assert error_of(http.put(secret, json={"value": "x"}, headers=bearer(b.token)))[0] == 403
    assert error_of(http.get(a.base + "/variables", headers=bearer(b.token)))[0] == 403
    assert error_of(http.delete(a.base, headers=bearer(b.token)))[0] == 403
    # B's own session has no such variable.
    assert error_of(b.get("/variables/secret", timeout_s=1))[:2] == (404, "var_id")
    assert error_of(http.get("/v1/sessions/s-nope", headers=bearer(b.token)))[:2] == (404, "session_id")
    ready = {"var_id": "secret", "state": "ready", "value": "A's text", "scores": None}
    assert a.get("/variables/secret").json() == ready


def test_bad_requests_get_4xx_naming_the_problem_and_change_nothing(small_server: LiveServer) -> None:
    c = Client(small_server.url, "good-key")
    assert c.post("/variables", {"var_id": "set", "value": "already"}).status_code == 201
    assert c.post("/variables", {"var_id": "free"}).status_code == 201
    assert (
        c.post(
            "/calls", {"template": "Q {{input:q}} A:{{output:a}}", "bindings": {"q": {"var_id": "free"}}}
        ).status_code
        == 200
    )
    before = c.state()
    small = {"default_sampling": {"max_tokens": 2}}
    cases: list[tuple[str, Any, int, str | None, str]] = [
        (
            "/calls",
            {"template": "Q {{input:q}} {{output:a}}", "bindings": {"q": {"value": "x"}, "zz": {"value": "y"}}},
            400,
            "bindings.zz",
            "names no placeholder",
        ),
        ("/calls", {"template": "Q {{input:q}} {{output:a}}"}, 400, "bindings.q", "has no binding"),
        ("/calls", {"template": "Q {{inptu:q}} {{output:a}}"}, 400, "template", "unknown placeholder kind"),
        (
            "/calls",
            {"template": "Q {{output:a}}", "bindings": {"a": {"var_id": "set"}}},
            409,
            "bindings.a.var_id",
            "already set",
        ),
        (
            "/calls",
            {"template": "Q {{input:q}} {{output:a}}", "bindings": {"q": {"var_id": "ghost"}}},
            404,
            "bindings.q.var_id",
            "unknown variable 'ghost'",
        ),
        (
            "/calls",
            {"template": "Q {{input:q}} {{output:a}}", "bindings": {"q": {"var_id": "c0~a"}, "a": {"var_id": "free"}}},
            400,
            "bindings",
            "dependency cycle through calls c1 -> c0 -> c1",
        ),
        ("/calls", {"template": "Q {{output:a}}", "model": "gpt-9"}, 404, "model", "unknown model 'gpt-9'"),
        (
            "/calls",
            {"template": "Q {{input:q}} {{output:a}}", "bindings": {"q": {"value": "word " * 5000}}, **small},
            400,
            "template",
            "exceed the model's context of 4096 tokens",
        ),
        (
            "/calls",
            {"template": "Q {{output:a}}", "default_sampling": {"max_tokens": 0}},
            400,
            "default_sampling.max_tokens",
            "greater than or equal to 1",
        ),
        ("/variables", {"var_id": "set"}, 409, "variables[0].var_id", "already exists"),
        ("/variables", {"var_id": "bad~id"}, 400, "var_id", "should match pattern"),
        (
            "/submit",
            {
                "variables": [{"var_id": "new"}],
                "calls": [{"template": "ok {{output:a}}"}, {"template": "bad {{input:x}} {{output:b}}"}],
            },
            400,
            "calls[1].bindings.x",
            "has no binding",
        ),
        (
            "/calls",
            {"template": "Q " + "x" * 70_000 + " {{output:a}}"},
            413,
            "body",
            "larger than the limit of 64000 bytes",
        ),
    ]
    for tail, body, status, field, needle in cases:
        resp = c.post(tail, body)
        got = error_of(resp)
        assert got[:2] == (status, field), (tail, body if len(str(body)) < 300 else "...", got)
        assert needle in got[2]
    # A streamed (chunked) body is counted as it arrives.
    chunks = [b'{"template": "'] + [b"x" * 1000] * 70 + [b' {{output:a}}"}']
    streamed = c.http.post(
        c.base + "/calls", content=iter(chunks), headers={**bearer(c.token), "content-type": "application/json"}
    )
    assert error_of(streamed) == (413, "body", "request body is larger than the limit of 64000 bytes")
    assert error_of(c.put("/variables/set", {"value": "twice"}))[:2] == (409, "value")
    assert error_of(c.put("/variables/c0~a", {"value": "mine"}))[:2] == (409, "var_id")
    assert error_of(c.put("/variables/free", {"value": "v", "error": "e"}))[:2] == (400, None)
    assert error_of(c.get("/variables/c0~a", timeout_s=0.05))[:2] == (408, "timeout_s")
    assert error_of(c.get("/variables/c0~a", timeout_s=10_000))[:2] == (400, "timeout_s")
    assert c.state() == before


def test_streaming_get_yields_tokens_then_done(server: LiveServer) -> None:
    c = Client(server.url)
    resp = c.post(
        "/calls",
        {"template": "Once upon a time{{output:story}}", "default_sampling": {"max_tokens": 6, "ignore_eos": True}},
    )
    var_id = resp.json()["outputs"]["story"]
    with c.http.stream("GET", f"{c.base}/variables/{var_id}/stream", headers=bearer(c.token)) as stream:
        assert stream.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in stream.iter_lines() if line]
    assert lines[-1] == {"text": "", "done": True, "error": None}
    value = c.get(f"/variables/{var_id}").json()["value"]
    assert "".join(line["text"] for line in lines) == value
    assert len(lines) >= 2  # streamed in pieces, not only at the end
    # A failed variable streams its error as the last line.
    c.post("/variables", {"var_id": "in"})
    out = c.post("/calls", {"template": "x {{input:i}} {{output:o}}", "bindings": {"i": {"var_id": "in"}}}).json()
    c.put("/variables/in", {"error": "upstream broke"})
    with c.http.stream("GET", f"{c.base}/variables/{out['outputs']['o']}/stream", headers=bearer(c.token)) as stream:
        lines = [json.loads(line) for line in stream.iter_lines() if line]
    assert lines[-1]["error"]["status"] == 424
    assert "upstream broke" in lines[-1]["error"]["message"]
    c.http.delete(c.base, headers=bearer(c.token))


def test_delete_frees_engine_contexts_and_wakes_waiting_gets(server: LiveServer) -> None:
    blocks_free = server.wait_blocks_free(server.stats().num_blocks_total).num_blocks_free
    c = Client(server.url)
    c.post("/variables", {"var_id": "never"})
    long = {"max_tokens": 400, "ignore_eos": True}
    r1 = c.post("/calls", {"template": "A long story: {{output:s}}", "default_sampling": long}).json()
    r2 = c.post(
        "/calls", {"template": "Waiting on " * 20 + "{{input:n}} {{output:w}}", "bindings": {"n": {"var_id": "never"}}}
    ).json()
    results: dict[str, httpx.Response] = {}

    def wait(name: str, var_id: str) -> None:
        results[name] = c.get(f"/variables/{var_id}", timeout_s=120)

    threads = [
        threading.Thread(target=wait, args=("running", r1["outputs"]["s"])),
        threading.Thread(target=wait, args=("waiting", r2["outputs"]["w"])),
    ]
    for t in threads:
        t.start()
    session = server.manager.sessions.sessions[c.session_id]
    deadline = time.monotonic() + 30
    # Wait until c0 is generating and c1's prefix sits in the engine.
    while not (session.graph.variables["c0~s"].chunks and session.runs["c1"].num_fill_requested):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    while server.stats().num_blocks_free >= blocks_free - 1:  # the early fill is on its way
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert c.http.delete(c.base, headers=bearer(c.token)).status_code == 204
    for t in threads:
        t.join(timeout=30)
    for name in ("running", "waiting"):
        assert error_of(results[name]) == (410, "session_id", f"session {c.session_id!r} was deleted")
    assert error_of(c.get("/variables/never"))[0] == 410
    assert server.wait_blocks_free(blocks_free).num_blocks_free == blocks_free


def test_idle_session_expires_and_frees_its_contexts(tiny_engine: AsyncEngine) -> None:
    config = ManagerConfig(
        limits=LimitsConfig(session_idle_timeout_s=0.3), lifecycle=LifecycleConfig(expiry_interval_s=0.05)
    )
    with live_server(tiny_engine, config) as srv:
        blocks_free = srv.wait_blocks_free(srv.stats().num_blocks_total).num_blocks_free
        c = Client(srv.url)
        c.post("/variables", {"var_id": "never"})
        c.post(
            "/calls", {"template": "Prefix " * 40 + "{{input:n}} {{output:w}}", "bindings": {"n": {"var_id": "never"}}}
        )
        deadline = time.monotonic() + 10
        while srv.stats().num_blocks_free == blocks_free:  # the prefix is filled early
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.6)
        status, field, message = error_of(c.get(""))
        assert [status, field] == [410, "session_id"]
        assert message == f"session {c.session_id!r} was expired after 0.3 s idle"
        assert srv.wait_blocks_free(blocks_free).num_blocks_free == blocks_free
