"""A call's run record (CallRun) and the executor's one table of them, stepped by hand (the
executor's loop is not started, so every step and its effects are the test's)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from fake_engine import FakeEngine
from manager_harness import new_session, run_manager

from parrot.protocol.objective import Criteria, Objective
from parrot.protocol.public_api import Binding, CallSpec, SubmitRequest, VariableSpec
from parrot.protocol.sampling import SamplingParams
from parrot.protocol.template import parse_template
from parrot.serve.config import ManagerConfig, SharingConfig
from parrot.serve.manager import Manager
from parrot.serve.policy.plan import Dispatch, EarlyFill
from parrot.serve.runtime.call_run import CallRun, CallState, EngineSlot
from parrot.serve.runtime.graph import CallNode
from parrot.serve.runtime.session import Session
from parrot.text import Tokenizer

WAITING, RUNNING, DONE, FAILED = CallState.WAITING, CallState.RUNNING, CallState.DONE, CallState.FAILED
TEMPLATE = "Say {{input:x}} now:{{output:o}}"


def submit_waiting(manager: Manager, session: Session) -> CallRun:
    """One call whose input `x` is not set yet."""
    call = CallSpec(template=TEMPLATE, bindings={"x": Binding(var_id="x")})
    manager.submit(session, SubmitRequest(variables=[VariableSpec(var_id="x")], calls=[call]))
    return session.runs["c0"]


async def settle(run: CallRun) -> None:
    """Until the call's latest task (if one is still in flight) and its done callbacks have run."""
    if run.task is not None:
        await asyncio.wait([run.task])


def test_a_call_goes_waiting_running_done_and_leaves_the_table(default_model_folder: Path) -> None:
    engine = FakeEngine(default_model_folder)
    tok = Tokenizer(default_model_folder)

    async def body(manager: Manager) -> None:
        executor, handle = manager.executor, manager.pool.handles["e0"]
        session = new_session(manager)
        run = submit_waiting(manager, session)
        key = (session.session_id, "c0")
        assert executor._runs == {key: run}
        assert [run.state, run.order, run.dirty, run.view, run.runner, run.engine_id] == [
            WAITING,
            0,
            True,
            None,
            None,
            None,
        ]

        # Waiting: its ready prefix ("Say ") is filled early on e0, up to its stable end (the space
        # merges into the value's first word); it stays waiting there.
        plan = executor.step()
        assert [plan.early_fill, plan.dispatch, plan.fail] == [(EarlyFill(key, "e0", 1),), (), ()]
        assert run.view is not None and [run.view.inputs_ready, run.view.num_ready_pieces] == [False, 1]
        assert [run.state, run.engine_id, run.num_fill_requested, run.dirty] == [WAITING, "e0", 1, True]
        assert run.runner is not None and run.task is not None and handle.num_early_filled_calls == 1
        await settle(run)
        assert [run.task, engine.contexts] == [None, {f"{key[0]}.c0": tok.encode("Say")}]

        # Its input is set: dispatched, counted in e0's load, out of the policy's sight.
        manager.set_variable(session, "x", "hello")
        assert run.dirty
        plan = executor.step()
        assert plan.dispatch == (Dispatch(key, "e0"),)
        assert [run.state, run.view, run.ready_since, run.dirty] == [RUNNING, None, None, False]
        assert run.slot == EngineSlot(handle, True, run.runner)
        assert run.objective is Objective.LATENCY and run.dispatched_at is not None and run.task is not None
        assert [handle.num_running_calls, handle.num_latency_calls, handle.num_early_filled_calls] == [1, 1, 0]

        # Done: the record leaves the table and keeps the usage the session's status reads.
        await settle(run)
        assert executor._runs == {}
        assert session.runs == {"c0": run}
        assert [run.state, run.runner, run.slot, run.task] == [DONE, None, None, None]
        assert [handle.num_running_calls, handle.num_latency_calls] == [0, 0]
        answer = tok.encode(" NOW:")  # the fake engine echoes the prompt's last word, then EOS
        assert run.num_prompt_tokens == len(tok.encode("Say hello now:"))
        assert [run.num_generated_tokens, run.num_cached_tokens, run.finish_reasons] == [len(answer), 0, {"o": "eos"}]
        assert run.output_tokens == {"o": [(t, None, None) for t in answer]}
        assert run.output_token_ids == {"o": answer}
        assert session.graph.variables["c0~o"].value == " NOW:"
        status = manager.status(session).calls[0]
        assert [status.state, status.engine_id, status.num_generated_tokens] == ["done", "e0", len(answer)]
        await executor.drain()
        assert engine.contexts == {}

    run_manager([engine], body, ManagerConfig(sharing=SharingConfig(prefix_sharing=False)), stepped=True)


def test_requeue_resets_exactly_the_run_fields_of_one_attempt() -> None:
    node = CallNode("c0", parse_template(TEMPLATE), {"x": "x"}, {"o": "c0~o"}, {"o": SamplingParams()}, "m")
    run = CallRun(node, order=7)
    kept = {
        "state": RUNNING,
        "engine_id": "e1",
        "num_fill_requested": 2,
        "dispatched_at": 5.0,
        "num_prompt_tokens": 40,
        "num_cached_tokens": 30,
        "num_generated_tokens": 4,
        "finish_reasons": {"a": "eos"},
        "objective": Objective.THROUGHPUT,
        "urgency": Criteria.LATENCY,
        "task_group": "c9",
        "priority": 3,
        "num_attempts": 1,
        "output_token_ids": {"o": [1, 2, 3]},
        "output_tokens": {"o": [(1, -0.5, None), (2, None, None), (3, None, None), (4, None, None)]},
        "dirty": False,
    }
    for name, value in kept.items():
        setattr(run, name, value)
    before = dict(vars(run))
    run.requeue()
    changed = {name: value for name, value in vars(run).items() if before[name] != value}
    reset = {"num_prompt_tokens": 0, "num_cached_tokens": 0, "num_fill_requested": 0, "dirty": True}
    assert changed == {"state": WAITING, "engine_id": None, "dispatched_at": None, **reset}
    assert run.order == 7 and run.call is node  # and the outputs so far stay, so the next run resumes


def test_is_settled_only_when_finished_with_nothing_left() -> None:
    node = CallNode("c0", parse_template(TEMPLATE), {"x": "x"}, {"o": "c0~o"}, {"o": SamplingParams()}, "m")
    run = CallRun(node, order=0)
    assert not run.is_settled  # waiting
    run.state = FAILED
    assert run.is_settled

    async def busy() -> None:
        run.task = asyncio.create_task(asyncio.sleep(0))
        assert not run.is_settled  # its last task has not ended
        await run.task

    asyncio.run(busy())


def test_dropping_a_session_removes_its_records_and_frees_their_contexts(default_model_folder: Path) -> None:
    engine = FakeEngine(default_model_folder, token_delay_s=0.05)

    async def body(manager: Manager) -> None:
        executor, handle = manager.executor, manager.pool.handles["e0"]
        doomed, kept = new_session(manager), new_session(manager)
        waiting, other = submit_waiting(manager, doomed), submit_waiting(manager, kept)
        go = CallSpec(template="Go on:{{output:o}}")
        manager.submit(doomed, SubmitRequest(calls=[go]))
        running = doomed.runs["c1"]
        plan = executor.step()  # the two waiting calls are filled early, the third runs
        assert {(f.key, f.num_pieces) for f in plan.early_fill} == {
            ((doomed.session_id, "c0"), 1),
            ((kept.session_id, "c0"), 1),
        }
        assert plan.dispatch == (Dispatch((doomed.session_id, "c1"), "e0"),)
        await settle(waiting)
        await settle(other)
        assert running.state is RUNNING and handle.num_running_calls == 1

        await manager.delete_session(doomed)
        await executor.drain()
        assert executor._runs == {(kept.session_id, "c0"): other}
        assert doomed.runs == {"c0": waiting, "c1": running}  # the dead session keeps its history
        assert [waiting.runner, running.runner, running.slot, running.state] == [None, None, None, FAILED]
        assert [handle.num_running_calls, handle.num_early_filled_calls] == [0, 1]
        assert list(engine.contexts) == [f"{kept.session_id}.c0"]

    run_manager([engine], body, ManagerConfig(sharing=SharingConfig(prefix_sharing=False)), stepped=True)
