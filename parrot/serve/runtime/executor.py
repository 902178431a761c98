"""The graph executor: releases calls onto engines as their inputs become ready.

Creates each call's run record (call_run.py) at submission and keeps the records in one table,
`_runs` (CallKey -> CallRun), until the call has finished and its last task and engine slot are
gone (`CallRun.is_settled`) or its session is dropped; waiting, dirty, placed (runner), running
(engine slot) and busy (latest task) are read from the record. Beside the table: the sessions of
its calls, the sessions to deduce again, the context frees in flight (a free outlives its record).

Event-driven: a new call, a set variable, a new `get`, a finished call or a dead engine marks calls
dirty and wakes one loop, which (1) re-deduces changed sessions' objectives and recomputes dirty
calls' views, (2) asks the policy for a plan and (3) applies it. Only step 3 has effects.

A whole DAG submitted at once runs level after level with no client round trip. A call's tasks run one after
another (an early fill, then the run): its context never sees two of our requests at once. A run whose engine
stops answering waits again and is dispatched again (on a live engine, at most `max_call_attempts` runs; its
runner resumes the outputs); one that runs past `call_deadline_s` fails with 504 (its engine work stops).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import Awaitable, Callable, Iterable

from parrot.protocol.engine_client import EngineUnavailable
from parrot.protocol.errors import ParrotError
from parrot.protocol.objective import Objective
from parrot.serve.config import ManagerConfig
from parrot.serve.policy.plan import CallKey, Plan, Snapshot
from parrot.serve.policy.registry import make_policy
from parrot.serve.runtime.call_run import CallRun, CallState, EngineSlot
from parrot.serve.runtime.call_runner import CallRunner
from parrot.serve.runtime.contexts import PrefixContexts
from parrot.serve.runtime.deduction import apply_deductions
from parrot.serve.runtime.engines import EngineHandle, EnginePool
from parrot.serve.runtime.frees import ContextFrees
from parrot.serve.runtime.graph import CallNode
from parrot.serve.runtime.session import Session
from parrot.serve.runtime.variable import Variable
from parrot.serve.runtime.views import CallViews

log = logging.getLogger(__name__)


class GraphExecutor:
    def __init__(
        self,
        pool: EnginePool,
        config: ManagerConfig,
        prefixes: PrefixContexts | None = None,
        on_engine_error: Callable[[str], None] = lambda engine_id: None,
    ) -> None:
        self.pool = pool
        self.config = config
        self.prefixes = prefixes
        self.on_engine_error = on_engine_error  # the health monitor probes the engine
        self.policy = make_policy(config.scheduling.policy)
        self._runs: dict[CallKey, CallRun] = {}  # the table (module docstring)
        self._sessions: dict[str, Session] = {}  # the sessions of the table's calls
        self._deduce: dict[str, Session] = {}  # sessions whose objectives need deducing again
        self._frees = ContextFrees()  # context frees in flight
        self._views = CallViews(pool, config, None if prefixes is None else prefixes.cache)
        self._order = itertools.count()
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self.num_steps = 0
        # Metrics and the request log (the manager's): a call just became done or failed.
        self.on_finish: Callable[[Session, CallRun], None] = lambda session, run: None

    def start(self) -> None:
        self._loop_task = asyncio.get_running_loop().create_task(self._loop(), name="parrot-graph-executor")

    async def stop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
            self._loop_task = None

    # --- events ---------------------------------------------------------------------------------

    def add_calls(self, session: Session, calls: Iterable[CallNode]) -> None:
        """Newly committed calls: each gets its run record, in the session and in the table."""
        self._sessions[session.session_id] = session
        for call in calls:
            run = CallRun(call, order=next(self._order), tenant=session.tenant)
            session.runs[call.call_id] = run
            self._runs[(session.session_id, call.call_id)] = run
            self._views.mark((session.session_id, call.call_id), run)
        self._deduce[session.session_id] = session
        self._wake.set()

    def criteria_changed(self, session: Session) -> None:
        """A `get` asked for new criteria: the session's objectives are deduced again."""
        self._deduce[session.session_id] = session
        self._wake.set()

    def engines_changed(self) -> None:
        """An engine was added, or its stats (capacity) changed: plan again."""
        self._wake.set()

    def variables_set(self, session: Session, variables: Iterable[Variable]) -> None:
        """Variables became set or failed: their consumers may be released (or fail)."""
        for var in variables:
            for call_id in var.consumer_call_ids:
                self._mark_dirty((session.session_id, call_id))
        self._wake.set()

    def _mark_dirty(self, key: CallKey) -> None:
        run = self._runs.get(key)
        if run is not None and run.state is CallState.WAITING:
            self._views.mark(key, run)

    def engine_died(self, engine_id: str) -> None:
        """Forget the engine's prefixes; its early-filled calls start over and its running calls
        are stopped and dispatched again elsewhere."""
        if self.prefixes is not None:
            self.prefixes.drop_engine(engine_id)
        for key, run in list(self._runs.items()):
            runner = run.runner
            if runner is None or runner.engine.engine_id != engine_id:
                continue
            runner.engine_lost = True
            if runner.task is not None and not runner.task.done():
                runner.task.cancel()  # its early fill or run sees engine_lost
            if run.state is CallState.WAITING:
                self._start_over(key, run)
        self._wake.set()

    def _start_over(self, key: CallKey, run: CallRun) -> None:
        """A waiting call's early work is lost: forget its runner; it may go anywhere now."""
        self._frees.retire(run)
        run.unplace()
        self._views.mark(key, run)
        self._wake.set()

    async def drop_session(self, session: Session) -> None:
        """Forget the session's calls, cancel their work and free their engine contexts."""
        sid = session.session_id
        self._deduce.pop(sid, None)
        self._sessions.pop(sid, None)
        # The session's records still in the table (its own index: no walk over every session's calls).
        runs = [run for call_id, run in session.runs.items() if self._runs.get((sid, call_id)) is run]
        for run in runs:
            del self._runs[(sid, run.call.call_id)]
            run.leave_waiting()
        tasks = [run.task for run in runs if run.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # Early-filled calls that never ran still hold a context.
        for run in runs:
            self._frees.retire(run)
        self._wake.set()

    def num_in_flight(self) -> int:
        """Calls running on an engine, or waiting with every input set (about to be dispatched)."""
        return sum(run.state is CallState.RUNNING or run.ready_since is not None for run in self._runs.values())

    async def drain(self) -> None:
        """Until every context free in flight is done (frees wait for generations to end)."""
        await self._frees.drain()

    # --- the loop ---------------------------------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                self.step()
            except Exception:  # a bug here must not stop every session
                log.exception("graph executor step failed")

    def step(self) -> Plan:
        self.num_steps += 1
        for session in self._deduce.values():
            self._deduce_objectives(session)
        self._deduce.clear()
        self._views.refresh(self._runs, lambda session_id: self._sessions[session_id].graph.variables)
        plan = self.policy.plan(self.snapshot())
        self._apply(plan)
        return plan

    def _deduce_objectives(self, session: Session) -> None:
        deduce = self.config.scheduling.objective_deduction
        for call_id in apply_deductions(session.graph, session.runs, self.config.scheduling.default_objective, deduce):
            self._mark_dirty((session.session_id, call_id))

    def snapshot(self) -> Snapshot:
        return self._views.snapshot()

    # --- applying a plan --------------------------------------------------------------------------

    def cancel(self, session: Session, run: CallRun) -> None:
        """The client cancels an unfinished call: its outputs fail (410), its run or early fill is
        cancelled (closing the generation's stream aborts it on the engine), its context is freed."""
        key, task = (session.session_id, run.call.call_id), run.task
        error = ParrotError(f"call {run.call.call_id} was cancelled by the client", status=410, field="call_id")
        if run.state is CallState.WAITING:
            self._fail_waiting(key, error)
        else:
            self._finish(session, run, error)
            self._chain(key, run, functools.partial(self._retire_after, run))  # after its run ends
        if task is not None:
            task.cancel()

    def _fail_waiting(self, key: CallKey, error: ParrotError) -> None:
        session, run = self._take(key)
        self._finish(session, run, error)
        if run.runner is not None:
            self._chain(key, run, functools.partial(self._retire_after, run))
        self._forget_if_settled(key, run)

    def _apply(self, plan: Plan) -> None:
        for fail in plan.fail:
            call = self._runs[fail.key].call
            var = self._sessions[fail.key[0]].graph.variables[fail.var_id]
            assert var.error is not None
            name = next(n for n, v in call.inputs.items() if v == fail.var_id)
            message = f"input {name!r} of call {call.call_id} failed: {var.error.message}"
            self._fail_waiting(fail.key, ParrotError(message, status=424, field=var.error.field))
        for fill in plan.early_fill:
            run = self._runs[fill.key]
            runner = self._runner(self._sessions[fill.key[0]], run, fill.engine_id)
            if not runner.counts_as_early_filled:
                runner.counts_as_early_filled = True
                runner.engine.num_early_filled_calls += 1
            run.num_fill_requested = fill.num_pieces
            self._views.mark(fill.key, run)
            self._chain(fill.key, run, functools.partial(self._early_fill, fill.key, run, runner, fill.num_pieces))
        for dispatch in plan.dispatch:
            session, run = self._take(dispatch.key)
            engine = self.pool.handles[dispatch.engine_id]
            runner = self._runner(session, run, dispatch.engine_id)
            if runner.counts_as_early_filled:
                runner.counts_as_early_filled = False
                runner.engine.num_early_filled_calls -= 1
            is_latency = run.objective is Objective.LATENCY
            engine.num_running_calls += 1
            engine.num_latency_calls += is_latency
            run.slot = EngineSlot(engine, is_latency, runner)
            self._views.placed.add(id(run), dispatch.key[0], run.task_group, dispatch.engine_id, run.tenant)
            run.state = CallState.RUNNING
            run.engine_id, run.fair_share = dispatch.engine_id, dispatch.fair_share
            run.dispatched_at = self.pool.clock.now()
            work = functools.partial(self._run, session, dispatch.key, run, runner, engine)
            self._chain(dispatch.key, run, work, counted=runner)

    def _uncount(self, run: CallRun, runner: CallRunner) -> None:
        """The run of `runner` ended: its engine has room again (a later run of the call keeps its own)."""
        if (slot := run.slot) is not None and slot.runner is runner:
            run.slot = None
            self._views.placed.remove(id(run))
            slot.engine.num_running_calls -= 1
            slot.engine.num_latency_calls -= slot.is_latency
            self._wake.set()

    def _take(self, key: CallKey) -> tuple[Session, CallRun]:
        """A waiting call leaves waiting (the caller sets its new state)."""
        run = self._runs[key]
        run.leave_waiting()
        return self._sessions[key[0]], run

    def _forget_if_settled(self, key: CallKey, run: CallRun) -> None:
        if run.is_settled and self._runs.get(key) is run:
            del self._runs[key]

    def _runner(self, session: Session, run: CallRun, engine_id: str) -> CallRunner:
        if run.runner is None:
            run.engine_id = engine_id
            run.runner = CallRunner(
                session.session_id,
                run.call,
                run,
                session.graph.variables,
                self.pool.handles[engine_id],
                lambda var: self.variables_set(session, [var]),
                self.prefixes,
                self.pool.clock,
            )
        return run.runner

    def _chain(
        self, key: CallKey, run: CallRun, work: Callable[[], Awaitable[None]], counted: CallRunner | None = None
    ) -> None:
        """Run `work` after the call's previous task, whatever that task's outcome; when it ends,
        the run of `counted` (a dispatch) leaves its engine slot."""
        prev = run.task

        async def chained() -> None:
            if prev is not None and not prev.done():
                await asyncio.wait([prev])
            await work()

        task = asyncio.get_running_loop().create_task(chained())
        run.task = task
        task.add_done_callback(functools.partial(self._task_done, key, run, counted))

    def _task_done(self, key: CallKey, run: CallRun, counted: CallRunner | None, task: asyncio.Task[None]) -> None:
        if run.task is task:
            run.task = None
        if counted is not None:
            self._uncount(run, counted)
        self._forget_if_settled(key, run)

    async def _early_fill(self, key: CallKey, run: CallRun, runner: CallRunner, num_pieces: int) -> None:
        runner.task = asyncio.current_task()
        try:
            await runner.fill_to(num_pieces)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if runner.engine_lost and task is not None:  # engine_died started the call over
                task.uncancel()
                return
            raise
        except ParrotError as e:
            if self._runs.get(key) is not run or run.state is not CallState.WAITING or run.runner is not runner:
                return  # dispatched meanwhile (the run refills and reports), started over or dropped
            if isinstance(e, EngineUnavailable):
                self.on_engine_error(runner.engine.engine_id)
                self._start_over(key, run)
                return
            self._fail_waiting(key, ParrotError(f"call {run.call.call_id} failed: {e.message}", status=e.status))

    async def _run(
        self, session: Session, key: CallKey, run: CallRun, runner: CallRunner, engine: EngineHandle
    ) -> None:
        call = run.call
        runner.task = asyncio.current_task()
        error: ParrotError | None = None
        try:
            if runner.engine is not engine:  # the early fill went elsewhere
                await runner.rebind(engine)
            if runner.engine_lost:
                raise EngineUnavailable(f"engine {engine.engine_id} died before call {call.call_id} ran")
            async with asyncio.timeout(self.config.limits.call_deadline_s):  # in this task: no extra hop
                await runner.run()
        except TimeoutError:
            deadline = self.config.limits.call_deadline_s
            error = ParrotError(f"call {call.call_id} ran past its deadline of {deadline:g} s", status=504)
        except EngineUnavailable as e:
            if self._requeue(session, key, run, runner):
                return
            error = e
        except ParrotError as e:
            error = e
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if runner.engine_lost and task is not None and self._requeue(session, key, run, runner):
                task.uncancel()
                return
            self._end(session, run, ParrotError(f"call {call.call_id} was cancelled", status=410))
            raise
        except Exception as e:  # an engine bug: the call fails, the manager keeps serving
            log.exception("call %s failed", runner.context_id)
            error = ParrotError(f"internal error in call {call.call_id}: {e}", status=500)
        self._end(session, run, error)

    def _end(self, session: Session, run: CallRun, error: ParrotError | None) -> None:
        call = run.call
        if error is not None:
            error = ParrotError(f"call {call.call_id} failed: {error.message}", status=error.status, field=error.field)
        self._finish(session, run, error)
        self._frees.retire(run)

    def _requeue(self, session: Session, key: CallKey, run: CallRun, runner: CallRunner) -> bool:
        """Put a call whose engine stopped answering back to waiting; False if out of attempts."""
        run.num_attempts += 1
        if run.num_attempts >= self.config.engines.max_call_attempts:
            return False
        outputs = [session.graph.variables[v] for v in run.call.outputs.values()]
        if self._runs.get(key) is not run or any(var.error is not None for var in outputs):
            return False  # its session was deleted meanwhile
        log.warning("engine %s lost call %s; dispatching it again", runner.engine.engine_id, runner.context_id)
        self.on_engine_error(runner.engine.engine_id)
        self._frees.retire(run)
        self._uncount(run, runner)
        run.requeue()
        self._views.mark(key, run)
        self._wake.set()
        return True

    def _finish(self, session: Session, run: CallRun, error: ParrotError | None) -> None:
        run.state = CallState.DONE if error is None else CallState.FAILED
        run.finished_at = self.pool.clock.now()
        self.on_finish(session, run)
        if error is not None:
            failed = []
            for var_id in run.call.outputs.values():
                var = session.graph.variables[var_id]
                if not var.is_done:
                    var.fail(error)
                    failed.append(var)
            self.variables_set(session, failed)
        self._wake.set()

    async def _retire_after(self, run: CallRun) -> None:
        self._frees.retire(run)
