"""A batch run to its end in one request (`POST /v1/run`, `SemanticFunction.arun`): the answer
carries the outputs and no session stays behind, whatever ends the run."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from live_server import LiveServer, live_server

from parrot.engine.async_engine import AsyncEngine
from parrot.frontend import AsyncSession, Input, Output, ParrotError, SamplingParams, semantic_function
from parrot.serve import ManagerConfig
from parrot.serve.config import AuthConfig

KEY = {"Authorization": "Bearer good-key"}
CALL = {
    "template": "Q {{input:q}} A:{{output:a}}",
    "bindings": {"q": {"var_id": "q"}, "a": {"var_id": "a"}},
    "default_sampling": {"max_tokens": 3, "ignore_eos": True},
}
BATCH = {"variables": [{"var_id": "q", "value": "cats"}, {"var_id": "a"}], "calls": [CALL]}


@semantic_function(sampling=SamplingParams(max_tokens=3, ignore_eos=True))
def react(text: Input, reaction: Output):
    """React to {{input:text}}:{{output:reaction}}"""


@semantic_function(sampling=SamplingParams(max_tokens=2, ignore_eos=True))
def two(text: Input, first: Output, second: Output = Output(max_tokens=3)):  # noqa: B008
    """{{input:text}} one:{{output:first}} two:{{output:second}}"""


@pytest.fixture
def keyed_server(tiny_engine: AsyncEngine) -> Iterator[LiveServer]:
    with live_server(tiny_engine, ManagerConfig(auth=AuthConfig(api_keys=("good-key",)))) as srv:
        yield srv


def decoded_tokens(server: LiveServer) -> int:
    return server.engine.engine.engine.stats().num_decode_tokens


def wait_until_idle(server: LiveServer, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while server.engine.engine.engine.stats().num_running and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.engine.engine.engine.stats().num_running == 0


def session_answer(url: str, fn: Any, *args: str) -> Any:
    async def app() -> Any:
        async with AsyncSession(url, api_key="good-key"):
            out = fn(*args)
            return tuple([await v.aget() for v in out]) if isinstance(out, tuple) else await out.aget()

    return asyncio.run(app())


def test_a_run_answers_its_outputs_and_leaves_no_session(keyed_server: LiveServer) -> None:
    http = httpx.Client(base_url=keyed_server.url, timeout=60)
    resp = http.post("/v1/run", json={"submit": BATCH, "outputs": ["a"]}, headers=KEY)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert [v["var_id"] for v in body["values"]] == ["a"]
    assert body["values"][0]["state"] == "ready"
    assert [c["outputs"] for c in body["submitted"]["calls"]] == [{"a": "a"}]
    assert keyed_server.manager.sessions.sessions == {}
    # The same batch in a session generates the same text (greedy).
    created = http.post("/v1/sessions", json={"submit": BATCH}, headers=KEY).json()
    auth = {"Authorization": f"Bearer {created['token']}"}
    in_session = http.get(f"/v1/sessions/{created['session_id']}/variables/a", headers=auth).json()["value"]
    assert body["values"][0]["value"] == in_session
    http.delete(f"/v1/sessions/{created['session_id']}", headers=auth)
    # Without `outputs`: every output of the batch's calls, in order.
    batch = {**BATCH, "variables": [{"var_id": "q", "value": "cats"}]}
    call = {**CALL, "bindings": {"q": {"var_id": "q"}}}  # the output's variable made by the server
    gets = keyed_server.manager.metrics.totals["gets"]
    every = http.post("/v1/run", json={"submit": {**batch, "calls": [call, call]}}, headers=KEY)
    assert every.status_code == 200, every.text
    assert keyed_server.manager.metrics.totals["gets"] == gets + 1  # one request: one client wait
    values = every.json()["values"]
    assert len(values) == 2
    assert values[0]["value"] == values[1]["value"] == body["values"][0]["value"]
    assert keyed_server.manager.sessions.sessions == {}


@pytest.mark.parametrize(
    ("body", "status", "field", "mention"),
    [
        ({"submit": BATCH, "outputs": ["nope"]}, 400, "outputs", "nope"),
        ({"submit": BATCH, "outputs": []}, 400, None, "outputs"),  # schema: at least one, or none given
        ({"submit": {"calls": [CALL]}}, 404, "submit.calls[0].bindings.q.var_id", "q"),
        ({"submit": BATCH, "timeout_s": 601}, 400, None, "timeout_s"),  # schema: FastAPI's check
    ],
)
def test_a_refused_run_names_its_field_and_leaves_no_session(
    keyed_server: LiveServer, body: dict[str, Any], status: int, field: str | None, mention: str
) -> None:
    resp = httpx.post(f"{keyed_server.url}/v1/run", json=body, headers=KEY, timeout=60)
    assert resp.status_code == status, resp.text
    if field is not None:
        assert resp.json()["error"]["field"] == field
    assert mention in resp.json()["error"]["message"]
    assert keyed_server.manager.sessions.sessions == {}
    bad_key = httpx.post(f"{keyed_server.url}/v1/run", json={"submit": BATCH}, headers={"Authorization": "Bearer x"})
    assert bad_key.status_code == 401
    assert bad_key.json()["error"]["field"] == "authorization"


def test_a_run_past_its_timeout_is_cancelled(keyed_server: LiveServer) -> None:
    long_call = {**CALL, "default_sampling": {"max_tokens": 4000, "ignore_eos": True}}
    body = {"submit": {**BATCH, "calls": [long_call]}, "timeout_s": 0.3}
    began, decoded = time.monotonic(), decoded_tokens(keyed_server)
    resp = httpx.post(f"{keyed_server.url}/v1/run", json=body, headers=KEY, timeout=60)
    assert resp.status_code == 408, resp.text
    assert resp.json()["error"]["field"] == "timeout_s"
    assert time.monotonic() - began < 10
    assert keyed_server.manager.sessions.sessions == {}
    wait_until_idle(keyed_server)
    assert decoded_tokens(keyed_server) - decoded < 4000  # stopped, not left to make its 4,000 tokens


def test_a_client_that_leaves_cancels_its_run(keyed_server: LiveServer) -> None:
    long_call = {**CALL, "default_sampling": {"max_tokens": 4000, "ignore_eos": True}}
    decoded = decoded_tokens(keyed_server)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{keyed_server.url}/v1/run", json={"submit": {**BATCH, "calls": [long_call]}}, headers=KEY, timeout=0.5
        )
    deadline = time.monotonic() + 10
    while keyed_server.manager.sessions.sessions and time.monotonic() < deadline:
        time.sleep(0.02)
    assert keyed_server.manager.sessions.sessions == {}
    wait_until_idle(keyed_server)
    assert decoded_tokens(keyed_server) - decoded < 4000


def test_arun_is_one_request_with_the_same_answer_as_a_session(
    keyed_server: LiveServer, requests_sent: list[str]
) -> None:
    expected = session_answer(keyed_server.url, react, "dogs")
    expected_two = session_answer(keyed_server.url, two, "dogs")
    requests_sent.clear()
    assert asyncio.run(react.arun(keyed_server.url, "dogs", api_key="good-key")) == expected
    assert asyncio.run(two.arun(keyed_server.url, text="dogs", api_key="good-key")) == expected_two
    assert requests_sent == ["POST /v1/run", "POST /v1/run"]
    assert keyed_server.manager.sessions.sessions == {}


def test_arun_refusals_send_nothing_and_errors_reach_the_caller(
    keyed_server: LiveServer, requests_sent: list[str]
) -> None:
    async def refused() -> None:
        with pytest.raises(ParrotError) as bad_timeout:
            await react.arun(keyed_server.url, "dogs", api_key="good-key", timeout=0)
        assert bad_timeout.value.field == "timeout"
        with pytest.raises(TypeError):
            await react.arun(keyed_server.url, api_key="good-key")  # its input is missing
        await asyncio.sleep(0.05)  # a flusher, had one been started, would have sent by now

    asyncio.run(refused())
    assert requests_sent == []
    with pytest.raises(ParrotError) as bad_key:
        asyncio.run(react.arun(keyed_server.url, "dogs", api_key="bad-key"))
    assert bad_key.value.status == 401
    assert requests_sent == ["POST /v1/run"]
