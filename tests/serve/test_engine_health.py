"""Engines over time, against FakeEngines: heartbeats and dead engines, re-dispatch that resumes a
cut-off generation exactly, eviction of idle cached prefixes by memory pressure (never one in
use), the latency cap calibrated from an engine's step profile, and engines added while serving.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fake_engine import FakeEngine
from manager_harness import new_session, now, run_manager

from parrot.protocol.engine_api import EngineStats, ExtendRequest, FreeContextRequest, TokenEvent
from parrot.protocol.engine_client import EngineUnavailable
from parrot.protocol.public_api import Binding, CallSpec, SubmitRequest
from parrot.serve.config import EnginesConfig, ManagerConfig, SchedulingConfig, SharingConfig
from parrot.serve.manager import Manager
from parrot.serve.policy.prefix import PointKind, PrefixPoint, prefix_points
from parrot.text import Tokenizer

STORY = " alpha beta gamma delta epsilon zeta eta theta iota kappa"


def continue_story(prompt: str) -> str:
    """The story's rest after what the prompt already holds of it (a resumed run continues it)."""
    told = prompt.split("Story:")[-1]
    assert STORY.startswith(told), told
    return STORY[len(told) :]


class MortalEngine(FakeEngine):
    """A FakeEngine that can die: then every request fails as an unreachable engine would."""

    def __init__(self, *args: object, die_after_tokens: int | None = None, **kw: object) -> None:
        super().__init__(*args, **kw)  # type: ignore[arg-type]
        self.dead = False
        self.die_after_tokens = die_after_tokens

    def _check(self) -> None:
        if self.dead:
            raise EngineUnavailable("engine fake is unreachable: ConnectError")

    async def extend(self, req: ExtendRequest) -> AsyncIterator[TokenEvent]:
        self._check()
        num_tokens = 0
        async for event in super().extend(req):
            if req.sampling is not None and num_tokens == self.die_after_tokens:
                self.dead = True
                self._check()
            num_tokens += 1
            yield event

    async def free(self, req: FreeContextRequest) -> None:
        self._check()
        await super().free(req)

    async def stats(self) -> EngineStats:
        self._check()
        return await super().stats()


def test_a_generation_cut_off_by_a_dead_engine_resumes_elsewhere(default_model_folder: Path) -> None:
    tok = Tokenizer(default_model_folder)
    dying = MortalEngine(default_model_folder, continue_story, token_delay_s=0.01, die_after_tokens=4)
    spare = MortalEngine(default_model_folder, continue_story, token_delay_s=0.01)
    config = ManagerConfig(engines=EnginesConfig(heartbeat_interval_s=0.05, engine_dead_after_s=0.3))

    async def body(manager: Manager) -> None:
        session = new_session(manager)
        spec = CallSpec(template="Tell it. Story:{{output:s}}")
        manager.submit(session, SubmitRequest(calls=[spec]))
        chunks = [c async for c in await manager.stream_variable(session, "c0~s")]
        # 10 ms a token: the dying engine streams 4 and fails at its 5th (0.05 s); the refused
        # probe declares it dead at once and the call resumes on the spare at 0.05 s.
        run = session.runs["c0"]
        assert [run.dispatched_at, run.finished_at] == pytest.approx([0.05, 0.15], abs=1e-9)
        # Streamed once, in order, across the two engines: nothing lost, nothing repeated.
        assert "".join(chunks) == STORY
        assert (await manager.get_variable(session, "c0~s")).value == STORY
        call = session.runs["c0"]
        assert [call.num_attempts, call.engine_id] == [1, "e1"]
        assert call.num_generated_tokens == 4 + len(
            tok.encode(continue_story("Story:" + tok.decode(call.output_token_ids["s"][:4])))
        )
        assert not manager.pool.handles["e0"].alive

    run_manager([dying, spare], body, config, virtual=True)
    n_prompt = len(tok.encode("Tell it. Story:"))
    context_id = next(c for _, op, c, _ in spare.log if op == "fill")
    assert context_id.endswith(".c0.r1")
    # The spare engine got the prompt, then the 4 tokens already streamed as the tokens of the
    # generating Extend of the rest.
    assert [(op, n) for _, op, c, n in spare.log if op in ("fill", "generate-fill", "generate")] == [
        ("fill", n_prompt),
        ("generate-fill", 4),
        ("generate", n_prompt + 4),
    ]


def test_a_silent_engine_is_declared_dead_and_gets_no_more_calls(default_model_folder: Path) -> None:
    engines = [MortalEngine(default_model_folder), MortalEngine(default_model_folder)]
    config = ManagerConfig(
        scheduling=SchedulingConfig(max_running_calls_per_engine=1),
        engines=EnginesConfig(heartbeat_interval_s=0.05, engine_dead_after_s=0.3),
    )

    async def body(manager: Manager) -> None:
        engines[1].dead = True
        # Virtual clock: heartbeats every 0.05 s from t=0; the silent engine is declared dead by
        # the first heartbeat that finds it silent for engine_dead_after_s, at 0.3 s exactly.
        assert now() == 0.0
        await asyncio.sleep(0.2999)
        assert manager.pool.handles["e1"].alive
        await asyncio.sleep(0.0002)
        assert not manager.pool.handles["e1"].alive
        assert manager.pool.handles["e1"].last_heartbeat == 0.0  # registered at 0, never answered
        session = new_session(manager)
        calls = [CallSpec(template=f"Question {i}:{{{{output:a}}}}") for i in range(3)]
        manager.submit(session, SubmitRequest(calls=calls))
        for i in range(3):
            await manager.get_variable(session, f"c{i}~a")
        assert {r.engine_id for r in session.runs.values()} == {"e0"}
        assert [h.model for h in manager.pool.alive] == ["fake"]

    run_manager(engines, body, config, virtual=True)


def test_idle_cached_prefixes_are_evicted_by_memory_pressure_never_in_use(default_model_folder: Path) -> None:
    tok = Tokenizer(default_model_folder)
    systems = {
        app: f"System prompt of application {app}: " + "be precise and short in every answer. " * 5 for app in "ABCD"
    }
    # Each cached prefix is its system prompt without the trailing space (it merges into the question).
    blocks = {app: -(-len(tok.encode(s.rstrip())) // 16) for app, s in systems.items()}
    # Four cached prefixes leave 4 blocks free (below half); the target frees exactly A's and B's.
    num_blocks = sum(blocks.values()) + 4
    target = (4 + blocks["A"] + blocks["B"]) / num_blocks
    engine = FakeEngine(default_model_folder, num_blocks=num_blocks)
    config = ManagerConfig(
        sharing=SharingConfig(prefix_evict_below_free=0.5, prefix_evict_to_free=target),
        engines=EnginesConfig(heartbeat_interval_s=1000.0),
    )

    async def body(manager: Manager) -> None:
        for app in "ABC":  # in this order: A is the least recently used
            session = new_session(manager)
            spec = CallSpec(template=systems[app] + "{{input:q}}:{{output:a}}", bindings={"q": Binding(value="q")})
            manager.submit(session, SubmitRequest(calls=[spec]))
            await manager.get_variable(session, "c0~a")
        # D's prefix is filled early and leased by its call, which waits for its input.
        waiting = new_session(manager)
        manager.submit(
            waiting,
            SubmitRequest(
                calls=[
                    CallSpec(
                        template=systems["D"] + "{{input:q}}:{{output:a}}", bindings={"q": Binding(var_id="later")}
                    )
                ],
                variables=[{"var_id": "later"}],  # type: ignore[list-item]
            ),
        )
        while len(manager.prefix_cache.entries()) < 4:
            await asyncio.sleep(0.01)
        await manager.drain()
        by_app = {app: manager.prefix_cache.longest("e0", _points(manager, systems[app])) for app in "ABCD"}
        assert by_app["D"] is not None and by_app["D"].num_users == 1
        handle = manager.pool.handles["e0"]
        assert await manager.health.probe(handle)
        evicted = [e for app, e in by_app.items() if e is not None and e not in manager.prefix_cache.entries()]
        # Free was below half: A and B, the least recently used, bring it back to the target.
        assert evicted == [by_app["A"], by_app["B"]]
        await asyncio.sleep(0.05)
        assert {c for _, op, c, _ in engine.log if op == "free" and c.startswith("pfx-")} == {
            by_app["A"].context_id,  # type: ignore[union-attr]
            by_app["B"].context_id,  # type: ignore[union-attr]
        }
        # Even with every idle prefix wanted back, the leased one stays.
        evict_all = ManagerConfig(sharing=SharingConfig(prefix_evict_below_free=1.0, prefix_evict_to_free=1.0))
        manager.prefixes.config = evict_all  # type: ignore[union-attr]
        await manager.health.probe(handle)
        assert manager.prefix_cache.entries() == [by_app["D"]]
        manager.set_variable(waiting, "later", "now")
        await manager.get_variable(waiting, "c0~a")

    run_manager([engine], body, config)
    d_fill = [n for _, op, c, n in engine.log if op == "generate-fill" and c.endswith(".c0")][-1]
    assert d_fill == len(tok.encode("now")) + len(tok.encode(":"))  # D forked from its leased prefix


def _points(manager: Manager, system: str) -> tuple[PrefixPoint, ...]:
    ids = manager.pool.handles["e0"].tokenizer.encode(system.rstrip())
    return prefix_points("fake", ids, [(len(ids), PointKind.VARIABLE)])


class ProfiledEngine(FakeEngine):
    """Reports a step profile: 20 ms per step allows 5 batched tokens (4 -> 16 ms, 8 -> 30 ms)."""

    async def stats(self) -> EngineStats:
        stats = await super().stats()
        return stats.model_copy(update={"step_ms_by_num_tokens": {1: 10.0, 2: 12.0, 4: 16.0, 8: 30.0}})


def test_latency_calls_never_exceed_the_calibrated_cap(default_model_folder: Path) -> None:
    engine = ProfiledEngine(default_model_folder, token_delay_s=0.02)
    config = ManagerConfig(scheduling=SchedulingConfig(tpot_target_ms=20.0, max_running_calls_per_engine=64))

    async def body(manager: Manager) -> None:
        handle = manager.pool.handles["e0"]
        assert handle.latency_cap == 5
        peak = 0
        apply = manager.executor._apply

        def apply_and_watch(plan):  # type: ignore[no-untyped-def]
            nonlocal peak
            apply(plan)
            peak = max(peak, handle.num_latency_calls)

        manager.executor._apply = apply_and_watch  # type: ignore[method-assign]
        session = new_session(manager)
        calls = [CallSpec(template=f"Question number {i} please:{{{{output:a}}}}") for i in range(12)]
        manager.submit(session, SubmitRequest(calls=calls))
        for i in range(12):
            await manager.get_variable(session, f"c{i}~a")
        assert peak == 5

    run_manager([engine], body, config)


def test_engines_added_while_serving_take_calls(default_model_folder: Path) -> None:
    first, second = FakeEngine(default_model_folder, token_delay_s=0.01), FakeEngine(default_model_folder)

    async def body(manager: Manager) -> None:
        handle = await manager.add_engine(second, max_running_calls=4)
        assert [handle.engine_id, handle.max_running_calls] == ["e1", 4]
        sessions = [new_session(manager) for _ in range(4)]  # four apps: spread by load
        for i, s in enumerate(sessions):
            manager.submit(s, SubmitRequest(calls=[CallSpec(template=f"Q{i}:{{{{output:a}}}}")]))
        for s in sessions:
            await manager.get_variable(s, "c0~a")
        assert [s.runs["c0"].engine_id for s in sessions] == ["e0", "e1", "e0", "e1"]

    run_manager([first], body, ManagerConfig())
