"""A session created with its first batch (`POST /v1/sessions` carrying `submit`): over HTTP, all
or nothing; in the SDK, the requests a one-call application sends."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from live_server import LiveServer, live_server

from parrot.engine.async_engine import AsyncEngine
from parrot.frontend import AsyncSession, Input, Output, ParrotError, SamplingParams, Session, semantic_function
from parrot.serve import ManagerConfig
from parrot.serve.config import AuthConfig

KEY = {"Authorization": "Bearer good-key"}
CALL = {
    "template": "Q {{input:q}} A:{{output:a}}",
    "bindings": {"q": {"var_id": "q"}, "a": {"var_id": "a"}},
    "default_sampling": {"max_tokens": 2, "ignore_eos": True},
}


@semantic_function(sampling=SamplingParams(max_tokens=2, ignore_eos=True))
def react(text: Input, reaction: Output):
    """React to {{input:text}}:{{output:reaction}}"""


@pytest.fixture
def keyed_server(tiny_engine: AsyncEngine) -> Iterator[LiveServer]:
    with live_server(tiny_engine, ManagerConfig(auth=AuthConfig(api_keys=("good-key",)))) as srv:
        yield srv


def num_sessions(http: httpx.Client) -> int:
    return len(http.get("/v1/sessions", headers=KEY).json()["sessions"])


def test_a_session_created_with_its_first_batch_runs_it(keyed_server: LiveServer) -> None:
    http = httpx.Client(base_url=keyed_server.url, timeout=60)
    batch = {"variables": [{"var_id": "q", "value": "cats"}, {"var_id": "a"}], "calls": [CALL]}
    created = http.post("/v1/sessions", json={"idle_timeout_s": 30, "submit": batch}, headers=KEY)
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["idle_timeout_s"] == 30
    assert [v["var_id"] for v in body["submitted"]["variables"]] == ["q", "a"]
    assert [c["outputs"] for c in body["submitted"]["calls"]] == [{"a": "a"}]
    got = http.get(
        f"/v1/sessions/{body['session_id']}/variables/a", headers={"Authorization": f"Bearer {body['token']}"}
    )
    assert got.status_code == 200 and got.json()["state"] == "ready"
    plain = http.post("/v1/sessions", headers=KEY).json()
    assert plain["submitted"] is None


@pytest.mark.parametrize(
    ("batch", "status", "field"),
    [
        ({"calls": [{**CALL, "template": "Q {{inptu:q}} {{output:a}}"}]}, 400, "submit.calls[0].template"),
        ({"variables": [{"var_id": "q"}, {"var_id": "q"}]}, 409, "submit.variables[1].var_id"),
        ({"calls": [CALL]}, 404, "submit.calls[0].bindings.q.var_id"),  # no such variable
        ({"calls": [{**CALL, "default_sampling": {"max_tokens": 0}}]}, 400, None),  # schema: FastAPI's check
    ],
)
def test_a_refused_first_batch_leaves_no_session(
    keyed_server: LiveServer, batch: dict[str, Any], status: int, field: str | None
) -> None:
    http = httpx.Client(base_url=keyed_server.url, timeout=60)
    before = num_sessions(http)
    resp = http.post("/v1/sessions", json={"submit": batch}, headers=KEY)
    assert resp.status_code == status, resp.text
    if field is not None:
        assert resp.json()["error"]["field"] == field
    else:
        assert "submit" in resp.text and "max_tokens" in resp.text
    assert num_sessions(http) == before


def test_a_one_call_app_costs_three_requests_and_an_empty_session_none(
    keyed_server: LiveServer, requests_sent: list[str]
) -> None:
    async def app() -> str:
        async with AsyncSession(keyed_server.url, api_key="good-key") as s:
            assert s.core.session_id == ""  # nothing sent on entering
            text = await react("cats").aget()
            assert s.session_id.startswith("s-")
            return text

    assert isinstance(asyncio.run(app()), str)
    # the session and its call, the get, the delete
    assert requests_sent == ["POST /v1/sessions", "GET /v1/sessions/{id}/variables/v0", "DELETE /v1/sessions/{id}"]
    assert keyed_server.manager.sessions.sessions == {}

    requests_sent.clear()
    with Session(keyed_server.url, api_key="good-key"):
        pass
    assert requests_sent == []


def test_a_refused_key_reaches_the_first_read_and_open_checks_it_up_front(
    keyed_server: LiveServer, requests_sent: list[str]
) -> None:
    async def app() -> None:
        async with AsyncSession(keyed_server.url, api_key="bad-key") as s:
            with pytest.raises(ParrotError) as no_id:
                _ = s.session_id
            assert no_id.value.status == 409
            with pytest.raises(ParrotError) as refused:
                await react("cats").aget()
            assert refused.value.status == 401
            assert refused.value.field == "authorization"

    asyncio.run(app())
    assert requests_sent == ["POST /v1/sessions"]  # no delete: there is no session
    s = Session(keyed_server.url, api_key="bad-key")
    try:
        with pytest.raises(ParrotError) as refused:
            s.open()
        assert refused.value.status == 401
    finally:
        s.close()


def test_a_sync_session_id_creates_the_session_and_later_batches_use_submit(
    keyed_server: LiveServer, requests_sent: list[str]
) -> None:
    with Session(keyed_server.url, api_key="good-key") as s:
        session_id = s.session_id  # created now, without a batch
        assert session_id in keyed_server.manager.sessions.sessions
        assert react("dogs").get()
    assert requests_sent[:2] == ["POST /v1/sessions", "POST /v1/sessions/{id}/submit"]
    assert requests_sent[-1] == "DELETE /v1/sessions/{id}"


def test_markers_name_the_session_before_the_server_does(keyed_server: LiveServer) -> None:
    """Markers name the session's client key: a variable passes into a later call of its session
    before the server has named the session."""

    @semantic_function(sampling=SamplingParams(max_tokens=2, ignore_eos=True))
    def pair(a: Input, b: Input, out: Output = Output()):  # noqa: B008
        """{{input:a}} and {{input:b}}:{{output:out}}"""

    with Session(keyed_server.url, api_key="good-key"):
        first = react("cats")
        second = pair(f"<{first}>", first)
        assert second.get() and first.get()


def test_a_sync_session_id_read_on_its_own_loop_raises_instead_of_hanging(keyed_server: LiveServer) -> None:
    with Session(keyed_server.url, api_key="good-key") as s:

        async def read() -> str:
            return s.session_id

        with pytest.raises(ParrotError) as not_yet:
            asyncio.run_coroutine_threadsafe(read(), s._loop).result(timeout=10)
        assert not_yet.value.status == 409
        assert not_yet.value.field == "session_id"
        assert s.session_id.startswith("s-")  # from the caller's thread: created now
