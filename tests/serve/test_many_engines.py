"""The app-centric manager over several tiny-model engines served over HTTP on loopback.

- Four applications with distinct long system prompts on four engines: each call lands on the
  engine holding its application's prefix while that engine has room under its latency cap, and
  no engine ever runs more latency-critical calls than its cap.
- Killing an engine mid-run: every application still completes, with the exact outputs, on the
  remaining engines (interrupted generations resume; nothing is lost or repeated).
Outputs are checked against generation run directly on an engine for the same token ids.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from engine_farm import ServedEngine, farm, reference

from parrot.backends.http_engine import HttpEngineClient
from parrot.engine.sched.job import ScheduledSeq
from parrot.protocol.public_api import Binding, CallSpec, SubmitRequest
from parrot.protocol.sampling import SamplingParams
from parrot.serve.config import EnginesConfig, ManagerConfig, SchedulingConfig
from parrot.serve.manager import Manager, create_manager
from parrot.serve.policy.plan import Plan
from parrot.serve.runtime.call_run import CallState
from parrot.serve.runtime.session import Session
from parrot.text import Tokenizer

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def system_prompt(app: int) -> str:
    return f"Agent {app} system prompt. " + f"You are agent number {app}; you plan, check and report tersely. " * 3


def open_session(manager: Manager) -> Session:
    created = manager.create_session("key")
    return manager.session(created.session_id, created.token)


def ask(manager: Manager, session: Session, app: int, questions: list[str]) -> list[str]:
    """Submit one call per question in one batch; returns the output variable ids."""
    calls = [
        CallSpec(
            template=system_prompt(app) + "{{input:q}}\nAnswer:{{output:a}}",
            bindings={"q": Binding(value=q)},
            default_sampling=GREEDY,
        )
        for q in questions
    ]
    return [c.outputs["a"] for c in manager.submit(session, SubmitRequest(calls=calls)).calls]


def watch_latency_peaks(manager: Manager) -> dict[str, int]:
    """Most latency-critical calls each engine ran at once (counters only grow in `_apply`)."""
    peaks = {e: 0 for e in manager.pool.handles}
    apply = manager.executor._apply

    def apply_and_watch(plan: Plan) -> None:
        apply(plan)
        for h in manager.pool.handles.values():
            peaks[h.engine_id] = max(peaks[h.engine_id], h.num_latency_calls)

    manager.executor._apply = apply_and_watch  # type: ignore[method-assign]
    return peaks


async def start_manager(engines: list[ServedEngine], config: ManagerConfig) -> Manager:
    manager = create_manager([HttpEngineClient(e.url) for e in engines], config=config)
    await manager.start()
    return manager


def test_calls_land_on_their_prefix_engine_within_the_latency_cap(tiny_model_folder: Path) -> None:
    tok = Tokenizer(tiny_model_folder)
    config = ManagerConfig(
        scheduling=SchedulingConfig(policy="app_centric", latency_cap_calls=3, max_running_calls_per_engine=8)
    )

    async def main(engines: list[ServedEngine]) -> None:
        manager = await start_manager(engines, config)
        peaks = watch_latency_peaks(manager)
        try:
            sessions = [open_session(manager) for _ in range(4)]
            # Round 1: each app's first call, in one scheduling step: one app per engine.
            first = [ask(manager, s, a, [f"app {a}: first"]) for a, s in enumerate(sessions)]
            await asyncio.gather(*(manager.get_variable(s, v[0]) for s, v in zip(sessions, first, strict=True)))
            holder = [s.runs["c0"].engine_id for s in sessions]
            assert sorted(holder) == ["e0", "e1", "e2", "e3"]  # type: ignore[type-var]
            # Round 2: three more calls per app (the cap): all on the engine holding the app's prefix.
            more = [ask(manager, s, a, [f"app {a}: q{j}" for j in range(3)]) for a, s in enumerate(sessions)]
            await asyncio.gather(
                *(manager.get_variable(s, v) for s, vs in zip(sessions, more, strict=True) for v in vs)
            )
            for a, s in enumerate(sessions):
                assert [s.runs[f"c{j}"].engine_id for j in (1, 2, 3)] == [holder[a]] * 3
                assert all(s.runs[f"c{j}"].num_cached_tokens > 30 for j in (1, 2, 3))
            # Round 3: app 0 sends five at once: three fit under its engine's cap, two go elsewhere.
            burst = ask(manager, sessions[0], 0, [f"app 0: burst {j}" for j in range(5)])
            await asyncio.gather(*(manager.get_variable(sessions[0], v) for v in burst))
            placed = [sessions[0].runs[f"c{j}"].engine_id for j in range(4, 9)]
            assert placed[:3] == [holder[0]] * 3
            assert holder[0] not in placed[3:]
            assert max(peaks.values()) == 3  # never beyond the cap
            # Outputs are exactly the engine's for the rendered prompts.
            ref = engines[0].engine
            for a, s in enumerate(sessions):
                for call in s.graph.calls.values():
                    q = s.graph.variables[call.inputs["q"]].value or ""
                    ids = tok.encode(system_prompt(a) + q + "\nAnswer:")
                    value = s.graph.variables[call.outputs["a"]].value
                    assert value == await reference(ref, ids, GREEDY), (a, call.call_id)
        finally:
            await manager.stop()

    with farm(tiny_model_folder, 4) as engines:
        asyncio.run(main(engines))


# The killed engine's compute thread still runs the cut-off generation, and its event sink fails on
# the stopped server's closed loop (an engine-side crash: that is the point here).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_killing_an_engine_mid_run_loses_no_application(tiny_model_folder: Path) -> None:
    tok = Tokenizer(tiny_model_folder)
    long = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    config = ManagerConfig(
        scheduling=SchedulingConfig(policy="app_centric"),
        engines=EnginesConfig(heartbeat_interval_s=0.2, heartbeat_timeout_s=1.0, engine_dead_after_s=1.5),
    )

    async def main(engines: list[ServedEngine]) -> None:
        # e1's forward pass freezes once a generation on it has 4 tokens: no call on it can then
        # finish in the time its server takes to stop (a race CI once lost, polling the manager).
        runner = engines[1].engine.engine.runner
        run_step = runner.run

        def freezing_run(seqs: list[ScheduledSeq], *args: object) -> object:
            if not thawed.is_set() and any(s.job.num_generated >= 4 for s in seqs):
                frozen.set()
                thawed.wait(timeout=120)
            return run_step(seqs, *args)

        runner.run = freezing_run  # type: ignore[method-assign]
        manager = await start_manager(engines, config)
        try:
            sessions = [open_session(manager) for _ in range(4)]
            for a, s in enumerate(sessions):  # a two-step chain per app
                manager.submit(
                    s,
                    SubmitRequest(
                        calls=[
                            CallSpec(
                                template=f"App {a} opens: {{{{input:q}}}}:{{{{output:x}}}}",
                                bindings={"q": Binding(value=f"topic {a}")},
                                default_sampling=long,
                            ),
                            CallSpec(
                                template="Continue {{input:x}} then:{{output:y}}",
                                bindings={"x": Binding(var_id="c0~x")},
                                default_sampling=long,
                            ),
                        ]
                    ),
                )
            # Kill e1 while one of its calls is half generated (frozen there).
            assert await asyncio.to_thread(frozen.wait, 60), "no call ran on e1"
            victims = [
                (s, call_id)
                for s in sessions
                for call_id, r in s.runs.items()
                if r.state is CallState.RUNNING and r.engine_id == "e1"
            ]
            engines[1].server.server.config.timeout_graceful_shutdown = 0  # a crash, not a drain
            await asyncio.to_thread(engines[1].server.stop)
            killed_at = time.monotonic()
            finals = await asyncio.gather(*(manager.get_variable(s, "c1~y", timeout_s=120) for s in sessions))
            while manager.pool.handles["e1"].alive:  # dead within seconds: at once if it refuses, else by silence
                assert time.monotonic() - killed_at < 5.0
                await asyncio.sleep(0.01)
            assert victims and all(s.runs[c].num_attempts == 1 for s, c in victims)
            assert all(s.runs[c].engine_id != "e1" for s, c in victims)
            ref = engines[0].engine
            for a, (s, final) in enumerate(zip(sessions, finals, strict=True)):
                x = await reference(ref, tok.encode(f"App {a} opens: topic {a}:"), long)
                assert s.graph.variables["c0~x"].value == x
                y = await reference(ref, tok.encode(f"Continue {x} then:"), long)
                assert final.value == y
                assert [r.num_generated_tokens for r in s.runs.values()] == [48, 48]
        finally:
            thawed.set()
            await manager.stop()

    frozen, thawed = threading.Event(), threading.Event()
    with farm(tiny_model_folder, 3) as engines:
        asyncio.run(main(engines))
