"""A call's prompt tokens and prefix points are computed once, at submit (on the thread that
tokenizes the batch), and the view the executor builds on the event loop reads them from the call."""

from __future__ import annotations

import pytest
from manager_harness import new_session, run_manager

from parrot.engine.async_engine import AsyncEngine
from parrot.protocol.public_api import Binding, CallSpec, SubmitRequest, VariableSpec
from parrot.serve import ManagerConfig
from parrot.serve.config import SharingConfig
from parrot.serve.manager import Manager
from parrot.serve.runtime import contexts


@pytest.mark.parametrize("prefix_sharing", [True, False])
def test_prefix_points_are_computed_at_submit_and_reused(
    tiny_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch, prefix_sharing: bool
) -> None:
    async def body(manager: Manager) -> None:
        session = new_session(manager)
        template = "You are a helpful assistant. " * 20 + "Question: {{input:q}}\nAnswer:{{output:a}}"
        spec = CallSpec(template=template, bindings={"q": Binding(var_id="q")})
        manager.submit(session, SubmitRequest(variables=[VariableSpec(var_id="q")], calls=[spec]))
        call = session.graph.calls["c0"]
        assert [len(call.points), manager.config.sharing.prefix_sharing] == [int(prefix_sharing), prefix_sharing]
        if prefix_sharing:
            ((_, points),) = call.points.values()
            assert len(points) >= 1
            # Building the view on the loop renders nothing again.
            monkeypatch.setattr(contexts, "render_prompt", lambda *a: pytest.fail("rendered again"))
            manager.executor.step()
            assert session.runs["c0"].prefix_points == points

    run_manager([tiny_engine], body, ManagerConfig(sharing=SharingConfig(prefix_sharing=prefix_sharing)), stepped=True)
