"""A restarted manager against engines that outlived the old one: it never names an old run's
context (outputs stay exact), and an old run's session token is told its session was lost."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fake_engine import FakeEngine

from parrot.protocol.errors import ParrotError
from parrot.protocol.public_api import Binding, CallSpec, SubmitRequest
from parrot.protocol.sampling import SamplingParams
from parrot.serve.config import EnginesConfig, LimitsConfig, ManagerConfig, SharingConfig
from parrot.serve.manager import Manager, create_manager

SYSTEM = "You are a careful assistant; you answer in one line and check every fact twice. " * 3


def prompt_length(prompt: str) -> str:
    return f" {len(prompt)}"  # any doubled or foreign context would show in the answer


async def one_call(manager: Manager, question: str) -> tuple[str, str]:
    """(the answer, the session token) of one call sharing SYSTEM as its prefix."""
    created = manager.create_session("key")
    session = manager.session(created.session_id, created.token)
    spec = CallSpec(
        template=SYSTEM + "Q: {{input:q}}\nA:{{output:a}}",
        bindings={"q": Binding(value=question)},
        default_sampling=SamplingParams(max_tokens=8, temperature=0.0),
    )
    manager.submit(session, SubmitRequest(calls=[spec]))
    value = (await manager.get_variable(session, "c0~a")).value
    assert value is not None
    return value, created.token


def test_a_restarted_manager_never_reuses_an_old_runs_context_ids(tiny_model_folder: Path) -> None:
    engine = FakeEngine(tiny_model_folder, responder=prompt_length)
    config = ManagerConfig(sharing=SharingConfig(min_prefix_tokens=8))

    async def main() -> None:
        old = create_manager([engine], config=config)
        await old.start()
        answers = [(await one_call(old, q))[0] for q in ("Why?", "How?")]
        old_ids = set(engine.contexts)
        assert any(c.startswith(f"pfx-{old.run_id}-") for c in old_ids)  # cached prefixes stay
        # The old manager dies without cleaning up (kill -9): its contexts stay on the engine.
        await old.executor.stop()
        await old.health.stop()
        new = create_manager([engine], config=config)
        await new.start()
        try:
            assert new.run_id != old.run_id
            again = [(await one_call(new, q))[0] for q in ("Why?", "How?")]
            assert again == answers
            assert {c for _, op, c, _ in engine.log if op == "fill" and c.startswith("pfx-")} >= {
                c for c in engine.contexts if c.startswith(f"pfx-{new.run_id}-")
            }
            assert not any(c.startswith(f"pfx-{new.run_id}-") for c in old_ids)
        finally:
            await new.stop()

    asyncio.run(main())


def test_an_earlier_runs_session_token_is_told_its_session_was_lost(tiny_model_folder: Path) -> None:
    engine = FakeEngine(tiny_model_folder)
    old, new = create_manager([engine]), create_manager([engine])
    created = old.create_session("key")
    with pytest.raises(ParrotError) as info:
        new.session(created.session_id, created.token)
    assert [info.value.status, info.value.field] == [410, "session_id"]
    assert "the manager restarted" in info.value.message
    with pytest.raises(ParrotError) as info:
        new.session(created.session_id, "pst-forged")
    assert info.value.status == 401


@pytest.mark.parametrize(("grace_s", "finished"), [(10.0, True), (0.05, False)])
def test_shutdown_drains_calls_in_flight_then_frees_everything(
    tiny_model_folder: Path, grace_s: float, finished: bool
) -> None:
    engine = FakeEngine(tiny_model_folder, responder=lambda p: " one two three four five six", token_delay_s=0.03)

    async def main() -> None:
        manager = create_manager([engine], config=ManagerConfig(sharing=SharingConfig(prefix_sharing=False)))
        await manager.start()
        created = manager.create_session("key")
        session = manager.session(created.session_id, created.token)
        spec = CallSpec(template="Count:{{output:o}}", default_sampling=SamplingParams(max_tokens=16))
        manager.submit(session, SubmitRequest(calls=[spec]))
        while not engine.busy:  # generating
            await asyncio.sleep(0.01)
        drain = asyncio.ensure_future(manager.drain_in_flight(grace_s))
        await asyncio.sleep(0)
        with pytest.raises(ParrotError) as info:
            manager.create_session("key")
        assert info.value.status == 503  # no new work while draining
        assert await drain == (0 if finished else 1)
        await manager.stop()
        var = session.graph.variables["c0~o"]
        if finished:
            assert var.value == " one two three four five six"
        else:
            assert var.error is not None and var.error.status == 410
        assert engine.contexts == {}  # every context freed

    asyncio.run(main())


def test_a_call_past_its_deadline_fails_with_504_and_stops(tiny_model_folder: Path) -> None:
    engine = FakeEngine(tiny_model_folder, responder=lambda p: " tick" * 40, token_delay_s=0.05)

    async def main() -> None:
        manager = create_manager(
            [engine],
            config=ManagerConfig(limits=LimitsConfig(call_deadline_s=0.3), sharing=SharingConfig(prefix_sharing=False)),
        )
        await manager.start()
        try:
            created = manager.create_session("key")
            session = manager.session(created.session_id, created.token)
            spec = CallSpec(template="Go:{{output:o}}", default_sampling=SamplingParams(max_tokens=64))
            manager.submit(session, SubmitRequest(calls=[spec]))
            with pytest.raises(ParrotError) as info:
                await manager.get_variable(session, "c0~o")
            assert [info.value.status, "deadline of 0.3 s" in info.value.message] == [504, True]
            await manager.drain()
            assert engine.busy == set()  # the generation stopped
            assert engine.contexts == {}
        finally:
            await manager.stop()

    asyncio.run(main())


def test_the_manager_holds_its_runs_contexts_on_a_renewed_lease(tiny_model_folder: Path) -> None:
    engine = FakeEngine(tiny_model_folder, responder=prompt_length)
    config = ManagerConfig(
        sharing=SharingConfig(min_prefix_tokens=8),
        engines=EnginesConfig(heartbeat_interval_s=0.02, context_lease_s=0.2),
    )

    async def main() -> None:
        manager = create_manager([engine], config=config)
        await manager.start()
        try:
            await one_call(manager, "Why?")
            await asyncio.sleep(0.3)
        finally:
            await manager.stop()
        run = manager.run_id
        assert engine.leases[0].prefixes == [f"s-{run}-", f"pfx-{run}-"]
        assert len(engine.leases) >= 3  # renewed every quarter of the lease while the manager lives
        # Every context this run created is named by its lease.
        created = {c for _, op, c, _ in engine.log if op in ("fill", "generate")}
        assert created and all(c.startswith((f"s-{run}-", f"pfx-{run}-")) for c in created)

    asyncio.run(main())
