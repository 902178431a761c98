"""Who may change the engines: operator keys register and remove them, tenant keys cannot; engine
URLs are checked before any connection; a removed engine's calls finish on the others."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from engine_farm import farm
from fake_engine import FakeEngine
from live_server import live_server, serve_app
from manager_harness import new_session, run_manager

from parrot.backends.http_engine import HttpEngineClient
from parrot.engine.async_engine import AsyncEngine
from parrot.engine.server.app import create_engine_app
from parrot.protocol.errors import ParrotError
from parrot.protocol.public_api import Binding, CallSpec, SubmitRequest
from parrot.protocol.sampling import SamplingParams
from parrot.serve import create_app, create_manager
from parrot.serve.config import AuthConfig, ManagerConfig, SchedulingConfig, SharingConfig
from parrot.serve.http.engines import check_engine_url
from parrot.serve.manager import Manager
from parrot.serve.runtime.session import SessionRegistry
from parrot.web.server_thread import ServerThread

TENANT, OPERATOR = {"Authorization": "Bearer tenant"}, {"Authorization": "Bearer op"}


def refusal(fn: object, *args: object) -> tuple[int, str | None]:
    with pytest.raises(ParrotError) as info:
        fn(*args)  # type: ignore[operator]
    return info.value.status, info.value.field


def test_keys_and_roles() -> None:
    roles = SessionRegistry(ManagerConfig(auth=AuthConfig(api_keys=("tenant",), operator_keys=("op",))))
    assert roles.tenant_of("tenant") != roles.tenant_of("op")  # an operator is a tenant too
    assert refusal(roles.tenant_of, "nobody") == (401, "authorization")
    assert refusal(roles.tenant_of, None) == (401, "authorization")
    roles.require_operator("op")
    assert refusal(roles.require_operator, "tenant") == (403, "authorization")
    assert refusal(roles.require_operator, "nobody") == (401, "authorization")
    # Tenant keys without operator keys: engines come from the command line only.
    assert refusal(
        SessionRegistry(ManagerConfig(auth=AuthConfig(api_keys=("tenant",)))).require_operator, "tenant"
    ) == (
        403,
        "authorization",
    )
    # No keys at all (development, loopback only): any key may.
    SessionRegistry(ManagerConfig()).require_operator("anything")


@pytest.mark.parametrize(
    "url",
    [
        "not a url",
        "ftp://127.0.0.1:8100",
        "http://",
        "http://127.0.0.1:99999",
        "http://127.0.0.1:port",
        "http://user:secret@127.0.0.1:8100",
        "http://127.0.0.1:8100/?next=x",
    ],
)
def test_engine_urls_are_checked_before_connecting(url: str) -> None:
    assert refusal(check_engine_url, url, ()) == (400, "url")


def test_engine_url_allowlist() -> None:
    check_engine_url("http://127.0.0.1:8100", ("http://127.0.0.1:",))
    assert refusal(check_engine_url, "http://10.0.0.9:8100", ("http://127.0.0.1:",)) == (400, "url")


def test_only_operators_register_and_remove_engines(tiny_engine: AsyncEngine) -> None:
    config = ManagerConfig(
        auth=AuthConfig(api_keys=("tenant",), operator_keys=("op",)),
        scheduling=SchedulingConfig(max_running_calls_per_engine=8),
    )
    with (
        live_server(tiny_engine, config) as srv,
        farm(tiny_engine.model_folder, 1) as (extra,),
        httpx.Client(base_url=srv.url, timeout=60) as http,
    ):
        body = {"url": extra.url}
        denied = http.post("/v1/engines", json=body, headers=TENANT)
        assert [denied.status_code, denied.json()["error"]["field"]] == [403, "authorization"]
        bad = http.post("/v1/engines", json={"url": "gopher://127.0.0.1:1"}, headers=OPERATOR)
        assert [bad.status_code, bad.json()["error"]["field"]] == [400, "url"]
        added = http.post("/v1/engines", json=body, headers=OPERATOR)
        assert [added.status_code, added.json()["engine_id"]] == [201, "e1"]
        assert http.delete("/v1/engines/e1", headers=TENANT).status_code == 403
        gone = http.delete("/v1/engines/e1", headers=OPERATOR)
        assert [gone.status_code, gone.json()["engine_id"], gone.json()["alive"]] == [200, "e1", False]
        missing = http.delete("/v1/engines/e7", headers=OPERATOR)
        assert [missing.status_code, missing.json()["error"]["field"]] == [404, "engine_id"]
        listed = http.get("/v1/engines", headers=TENANT).json()["engines"]
        assert [e["engine_id"] for e in listed] == ["e0"]


def test_a_removed_engines_calls_finish_on_the_others(tiny_model_folder: Path) -> None:
    slow = FakeEngine(tiny_model_folder, responder=lambda p: " one two three four five six", token_delay_s=0.05)
    spare = FakeEngine(tiny_model_folder, responder=lambda p: " one two three four five six")
    sampling = SamplingParams(max_tokens=16, temperature=0.0)

    async def body(manager: Manager) -> None:
        session = new_session(manager)
        spec = CallSpec(template="Count {{input:x}}:{{output:o}}", bindings={"x": Binding(value="up")})
        manager.submit(session, SubmitRequest(calls=[spec.model_copy(update={"default_sampling": sampling})]))
        while not any(c.startswith(session.session_id) for c in slow.busy):  # generating on e0
            await asyncio.sleep(0.01)
        await manager.remove_engine("e0")
        assert list(manager.pool.handles) == ["e1"]
        assert (await manager.get_variable(session, "c0~o")).value == " one two three four five six"
        assert session.runs["c0"].engine_id == "e1"

    run_manager(
        [slow, spare],
        body,
        ManagerConfig(
            scheduling=SchedulingConfig(max_running_calls_per_engine=1), sharing=SharingConfig(prefix_sharing=False)
        ),
    )


def test_without_a_live_engine_every_route_says_503_and_ready_tells(tiny_engine: AsyncEngine) -> None:
    key = {"Authorization": "Bearer k"}  # development mode: any key is an operator
    completion = {"model": "tiny", "prompt": "Hello", "max_tokens": 2}
    with (
        live_server(tiny_engine, ManagerConfig()) as srv,
        farm(tiny_engine.model_folder, 1) as (extra,),
        httpx.Client(base_url=srv.url, timeout=60) as http,
    ):
        assert http.get("/ready").json() == {"status": "ready", "num_live_engines": 1, "models": ["tiny"]}
        assert http.delete("/v1/engines/e0", headers=key).status_code == 200
        assert http.get("/health").status_code == 200  # liveness: the manager itself answers
        assert http.get("/ready").status_code == 503
        assert http.post("/v1/completions", json=completion, headers=key).status_code == 503
        session = http.post("/v1/sessions", headers=key).json()
        auth = {"Authorization": f"Bearer {session['token']}"}
        call = {"template": "Hi {{output:o}}"}
        refused = http.post(f"/v1/sessions/{session['session_id']}/submit", json={"calls": [call]}, headers=auth)
        assert [refused.status_code, refused.json()["error"]["message"].startswith("no live engine")] == [503, True]
        assert http.post("/v1/engines", json={"url": extra.url}, headers=key).status_code == 201
        assert http.get("/ready").json()["num_live_engines"] == 1
        assert http.post("/v1/completions", json=completion, headers=key).status_code == 200


def test_an_engine_with_a_secret_answers_only_its_manager(tiny_engine: AsyncEngine) -> None:
    with ServerThread(create_engine_app(tiny_engine, secret="s3cret")) as srv:
        refused = httpx.get(srv.url + "/v1/engine/stats")
        assert [refused.status_code, refused.json()["error"]["field"]] == [401, "authorization"]
        wrong = httpx.get(srv.url + "/v1/engine/stats", headers={"Authorization": "Bearer guess"})
        assert wrong.status_code == 401
        assert httpx.get(srv.url + "/health").status_code == 200  # liveness stays open

        async def stats(secret: str | None) -> str:
            client = HttpEngineClient(srv.url, secret=secret)
            try:
                return (await client.stats()).model
            finally:
                await client.aclose()

        assert asyncio.run(stats("s3cret")) == "tiny"
        with pytest.raises(ParrotError) as info:
            asyncio.run(stats(None))
        assert [info.value.status, info.value.field] == [401, "authorization"]


def test_an_operator_sees_every_session_and_a_tenant_its_own(tiny_model_folder: Path) -> None:
    config = ManagerConfig(auth=AuthConfig(api_keys=("alice", "bob"), operator_keys=("ops",)))
    manager = create_manager([FakeEngine(tiny_model_folder)], config=config)
    with serve_app(create_app(manager)) as (url, _), httpx.Client(base_url=url) as http:

        def auth(key: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {key}"}

        alice = http.post("/v1/sessions", headers=auth("alice")).json()
        bob = http.post("/v1/sessions", headers=auth("bob")).json()

        def listed(key: str) -> list[str]:
            resp = http.get("/v1/sessions", headers=auth(key))
            assert resp.status_code == 200, resp.text
            return sorted(s["session_id"] for s in resp.json()["sessions"])

        assert listed("ops") == sorted([alice["session_id"], bob["session_id"]])
        assert listed("alice") == [alice["session_id"]]
        assert http.get("/v1/sessions", headers=auth("mallory")).status_code == 401
        # The status of any session: the operator key, or that session's own token; not another tenant's key.
        assert http.get(f"/v1/sessions/{bob['session_id']}", headers=auth("ops")).status_code == 200
        assert http.get(f"/v1/sessions/{bob['session_id']}", headers=auth(bob["token"])).status_code == 200
        denied = http.get(f"/v1/sessions/{bob['session_id']}", headers=auth("alice"))
        assert [denied.status_code, denied.json()["error"]["field"]] == [403, "authorization"]
        assert http.get(f"/v1/sessions/{bob['session_id']}", headers=auth(alice["token"])).status_code == 403
        # An operator key reads a status; it does not act as the session (submit needs its token).
        submit = http.post(
            f"/v1/sessions/{bob['session_id']}/calls", json={"template": "x{{output:o}}"}, headers=auth("ops")
        )
        assert submit.status_code == 401
