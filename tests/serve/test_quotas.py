"""Per-tenant quotas: open sessions and unfinished calls, over which a request gets 429 with
Retry-After naming the limit; other tenants are not affected."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from fake_engine import FakeEngine
from live_server import serve_app
from manager_harness import new_session, run_manager

from parrot.protocol.errors import ParrotError
from parrot.protocol.public_api import Binding, CallSpec, SubmitRequest, VariableSpec
from parrot.serve import ManagerConfig, create_app, create_manager
from parrot.serve.manager import Manager


def test_open_calls_per_tenant_and_sessions_per_tenant(tiny_model_folder: Path) -> None:
    engine = FakeEngine(tiny_model_folder)
    config = ManagerConfig(max_sessions_per_tenant=3, max_open_calls_per_tenant=4, prefix_sharing=False)
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
    manager = create_manager([FakeEngine(tiny_model_folder)], config=ManagerConfig(max_sessions_per_tenant=1))
    with serve_app(create_app(manager)) as (url, _), httpx.Client(base_url=url) as http:
        key = {"Authorization": "Bearer k"}
        assert http.post("/v1/sessions", headers=key).status_code == 201
        refused = http.post("/v1/sessions", headers=key)
        assert [refused.status_code, refused.headers.get("retry-after")] == [429, "5"]
