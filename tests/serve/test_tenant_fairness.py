"""One tenant's flood delays only that tenant: another tenant's call is dispatched while the flood
still runs (past an engine cap the flood fills) and reaches the engine ranked above the flood's
requests, so the engine's tiers serve it first. Real manager and tiny engine; the assertions are
on what was sent and in which order, not on times."""

from __future__ import annotations

import asyncio

from manager_harness import new_session, run_manager

from parrot.engine.async_engine import AsyncEngine
from parrot.protocol.engine_api import ExtendRequest
from parrot.protocol.public_api import CallSpec, SubmitRequest
from parrot.protocol.sampling import SamplingParams
from parrot.serve import ManagerConfig
from parrot.serve.config import SchedulingConfig, SharingConfig
from parrot.serve.manager import Manager


class PriorityLog:
    """Delegates to an engine; logs (tenant tag, priority) of every generating Extend, in order."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.model_folder = engine.model_folder
        self.sent: list[tuple[str, int]] = []
        self.tags: dict[str, str] = {}  # session id -> tenant tag

    async def extend(self, req: ExtendRequest):  # type: ignore[no-untyped-def]
        if req.sampling is not None:
            tag = next((t for s, t in self.tags.items() if s in req.context_id), "?")
            self.sent.append((tag, req.priority))
        async for event in self.engine.extend(req):
            yield event

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.engine, name)


def test_a_tenants_call_passes_another_tenants_awaited_flood(tiny_engine: AsyncEngine) -> None:
    log = PriorityLog(tiny_engine)
    config = ManagerConfig(
        scheduling=SchedulingConfig(max_running_calls_per_engine=4), sharing=SharingConfig(prefix_sharing=False)
    )

    async def body(manager: Manager) -> None:
        flood = new_session(manager, "flooder")
        log.tags[flood.session_id] = "flood"
        calls = [
            CallSpec(template=f"{i} " + "word " * 300 + "{{output:o}}", default_sampling=SamplingParams(max_tokens=8))
            for i in range(12)
        ]
        submitted = manager.submit(flood, SubmitRequest(calls=calls))
        gets = [
            asyncio.ensure_future(manager.get_variable(flood, c.outputs["o"], timeout_s=120)) for c in submitted.calls
        ]
        while len(log.sent) < 4:  # the flood fills the engine's cap of 4
            await asyncio.sleep(0.005)
        victim = new_session(manager, "victim")
        log.tags[victim.session_id] = "victim"
        manager.submit(victim, SubmitRequest(calls=[CallSpec(template="Hi{{output:o}}")]))
        await manager.get_variable(victim, "c0~o", timeout_s=120)
        finished = sum(g.done() for g in gets)
        await asyncio.gather(*gets)
        # The victim ran while most of the flood still waited: it did not queue behind it.
        assert finished < 8, finished

    run_manager([log], body, config)
    victim = [p for t, p in log.sent if t == "victim"]
    flood = [p for t, p in log.sent if t == "flood"]
    # Over its share beside a tenant under its own: the victim's request ranks above every flood
    # request (a person awaits both: deduced priority 1; the victim's share adds 2).
    assert [len(victim), len(flood), victim[0]] == [1, 12, 3]
    assert max(flood) < victim[0]
    position = [t for t, _ in log.sent].index("victim")
    assert position < 12, log.sent  # sent before the flood's last calls
