"""Per-tenant quotas: open sessions, unfinished calls and their tokens, requests per second (over
them a request gets 429 with Retry-After naming the limit), and text stored per session (413);
other tenants are not affected."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from fake_engine import FakeEngine
from live_server import serve_app
from manager_harness import new_session, run_manager

from parrot.protocol.errors import ParrotError
from parrot.protocol.public_api import Binding, CallSpec, SubmitRequest, VariableSpec
from parrot.protocol.sampling import SamplingParams
from parrot.serve import ManagerConfig, create_app, create_manager
from parrot.serve.config import LimitsConfig, SharingConfig
from parrot.serve.manager import Manager
from parrot.serve.runtime.rate import RateLimiter


def test_open_calls_per_tenant_and_sessions_per_tenant(tiny_model_folder: Path) -> None:
    engine = FakeEngine(tiny_model_folder)
    config = ManagerConfig(
        limits=LimitsConfig(max_sessions_per_tenant=3, max_open_calls_per_tenant=4),
        sharing=SharingConfig(prefix_sharing=False),
    )
    waiting = CallSpec(template="Echo {{input:x}}:{{output:o}}", bindings={"x": Binding(var_id="x")})

    async def body(manager: Manager) -> None:
        flood = new_session(manager, "flooder")
        # Four calls that wait for an input that never comes: the tenant's limit.
        manager.submit(flood, SubmitRequest(variables=[VariableSpec(var_id="x")], calls=[waiting] * 4))
        with pytest.raises(ParrotError) as info:
            manager.submit(flood, SubmitRequest(calls=[CallSpec(template="Hi{{output:o}}")]))
        assert [info.value.status, info.value.field, info.value.retry_after_s] == [429, "calls", 1]
        assert "4 unfinished calls" in info.value.message
        # Another tenant is not affected.
        other = new_session(manager, "other")
        manager.submit(other, SubmitRequest(calls=[CallSpec(template="Hi{{output:o}}")]))
        assert (await manager.get_variable(other, "c0~o")).value is not None
        # Sessions: the flooder has 1 open and may open 2 more, not 3.
        new_session(manager, "flooder")
        new_session(manager, "flooder")
        with pytest.raises(ParrotError) as info:
            new_session(manager, "flooder")
        assert [info.value.status, info.value.retry_after_s] == [429, 5]
        new_session(manager, "other")  # still fine for others

    run_manager([engine], body, config)


def test_a_429_carries_retry_after_over_http(tiny_model_folder: Path) -> None:
    manager = create_manager(
        [FakeEngine(tiny_model_folder)], config=ManagerConfig(limits=LimitsConfig(max_sessions_per_tenant=1))
    )
    with serve_app(create_app(manager)) as (url, _), httpx.Client(base_url=url) as http:
        key = {"Authorization": "Bearer k"}
        assert http.post("/v1/sessions", headers=key).status_code == 201
        refused = http.post("/v1/sessions", headers=key)
        assert [refused.status_code, refused.headers.get("retry-after")] == [429, "5"]


def test_the_rate_limiter_refills_at_its_rate_and_names_when_to_retry() -> None:
    now = [100.0]
    limiter = RateLimiter(rate=2.0, burst=3, clock=lambda: now[0])
    for _ in range(3):
        limiter.charge("a")  # the burst
    with pytest.raises(ParrotError) as info:
        limiter.charge("a")
    assert [info.value.status, info.value.field, info.value.retry_after_s] == [429, "authorization", 0.5]
    limiter.charge("b")  # another tenant has its own bucket
    now[0] += 0.5  # one request's worth at 2 per second
    limiter.charge("a")
    with pytest.raises(ParrotError):
        limiter.charge("a")
    now[0] += 10.0  # refills up to the burst, not beyond
    for _ in range(3):
        limiter.charge("a")
    with pytest.raises(ParrotError):
        limiter.charge("a")


def test_requests_per_second_per_tenant_over_http(tiny_model_folder: Path) -> None:
    config = ManagerConfig(limits=LimitsConfig(max_requests_per_s_per_tenant=0.01, request_burst_per_tenant=2))
    manager = create_manager([FakeEngine(tiny_model_folder)], config=config)
    with serve_app(create_app(manager)) as (url, _), httpx.Client(base_url=url) as http:
        created = http.post("/v1/sessions", headers={"Authorization": "Bearer k"}).json()
        token = {"Authorization": f"Bearer {created['token']}"}
        assert http.get(f"/v1/sessions/{created['session_id']}", headers=token).status_code == 200
        refused = http.get(f"/v1/sessions/{created['session_id']}", headers=token)  # the third request
        assert [refused.status_code, refused.json()["error"]["field"]] == [429, "authorization"]
        assert int(refused.headers["retry-after"]) >= 99
        other = http.post("/v1/sessions", headers={"Authorization": "Bearer other"})
        assert other.status_code == 201  # another tenant is not affected


def test_text_stored_per_session_is_bounded(tiny_model_folder: Path) -> None:
    config = ManagerConfig(
        limits=LimitsConfig(max_chars_per_session=1_000), sharing=SharingConfig(prefix_sharing=False)
    )
    waiting = CallSpec(template="Echo {{input:x}}:{{output:o}}", bindings={"x": Binding(var_id="x")})

    async def body(manager: Manager) -> None:
        session = new_session(manager, "k")
        manager.submit(session, SubmitRequest(variables=[VariableSpec(var_id="x")], calls=[waiting]))
        with pytest.raises(ParrotError) as info:
            manager.submit(session, SubmitRequest(variables=[VariableSpec(var_id="y", value="v" * 990)]))
        assert [info.value.status, info.value.field] == [413, "variables"]
        assert "the limit is 1000" in info.value.message
        with pytest.raises(ParrotError) as info:
            manager.set_variable(session, "x", "v" * 990)
        assert [info.value.status, info.value.field] == [413, "value"]
        manager.set_variable(session, "x", "v" * 900)  # within the limit: stored
        assert session.num_chars == len(waiting.template) + 900
        assert (await manager.get_variable(session, "c0~o")).value is not None
        assert new_session(manager, "k").num_chars == 0  # a new session starts empty

    run_manager([FakeEngine(tiny_model_folder)], body, config)


def test_tokens_in_flight_per_tenant(tiny_model_folder: Path) -> None:
    """A call counts its known prompt tokens plus its outputs' max_tokens until it finishes."""
    config = ManagerConfig(
        limits=LimitsConfig(max_tokens_in_flight_per_tenant=100), sharing=SharingConfig(prefix_sharing=False)
    )
    waiting = CallSpec(
        template="Echo {{input:x}}:{{output:o}}",
        bindings={"x": Binding(var_id="x")},
        default_sampling=SamplingParams(max_tokens=40),
    )

    async def body(manager: Manager) -> None:
        flood = new_session(manager, "flooder")
        manager.submit(flood, SubmitRequest(variables=[VariableSpec(var_id="x")], calls=[waiting, waiting]))
        held = flood.num_tokens_in_flight
        assert 80 < held < 100  # 2 x (a few prompt tokens + 40)
        small = CallSpec(template="Hi{{output:o}}", default_sampling=SamplingParams(max_tokens=100 - held))
        with pytest.raises(ParrotError) as info:
            manager.submit(flood, SubmitRequest(calls=[small]))
        assert [info.value.status, info.value.field, info.value.retry_after_s] == [429, "calls", 1]
        assert f"has {held} tokens in flight" in info.value.message
        other = new_session(manager, "other")  # another tenant is not affected
        manager.submit(other, SubmitRequest(calls=[small]))
        manager.set_variable(flood, "x", "done")  # the flood's calls finish: their tokens come back
        for call in ("c0~o", "c1~o"):
            await manager.get_variable(flood, call)
        assert flood.num_tokens_in_flight == 0
        manager.submit(flood, SubmitRequest(calls=[small]))

    run_manager([FakeEngine(tiny_model_folder)], body, config)
