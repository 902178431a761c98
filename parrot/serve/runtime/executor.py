"""The graph executor: releases calls onto engines as their inputs become ready.

Owns every not-yet-dispatched call (across sessions), the runners of placed calls and their tasks.
Event-driven: a new call, a set variable, a new `get`, a finished call or a dead engine marks
calls dirty and wakes one loop, which (1) re-deduces the objectives of changed sessions
(objectives.py) and recomputes the dirty calls' views (views.py), (2) asks the policy for a plan on
the snapshot and (3) applies the plan. Only step 3 has effects, so the decision logic stays pure
(scheduler.py, app_centric.py).

Because a consumer's release needs only its producer's output variable, a whole DAG submitted at
once runs level after level with no client round trip. The tasks of one call run one after another
(an early fill, then the run), so a call's context never sees two of our requests at once.

A run whose engine stops answering goes back to waiting and is dispatched again (on a live engine,
at most `max_call_attempts` runs); its runner resumes the outputs (call_runner.py).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from parrot.protocol.engine_client import EngineUnavailable
from parrot.protocol.errors import ParrotError
from parrot.protocol.objective import Objective
from parrot.serve.config import ManagerConfig
from parrot.serve.policy.plan import CallKey, CallView, Plan, Snapshot
from parrot.serve.policy.registry import make_policy
from parrot.serve.runtime.call_runner import CallRunner
from parrot.serve.runtime.contexts import PrefixContexts
from parrot.serve.runtime.deduction import apply_deductions
from parrot.serve.runtime.engines import EngineHandle, EnginePool
from parrot.serve.runtime.graph import CallNode, CallState
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
        self.policy = make_policy(config.policy)
        self._waiting: dict[CallKey, tuple[Session, CallNode]] = {}
        self._views = CallViews(pool, config, None if prefixes is None else prefixes.cache)
        self._dirty: set[CallKey] = set()
        self._deduce: dict[str, Session] = {}  # sessions whose objectives need deducing again
        self._runners: dict[CallKey, CallRunner] = {}
        self._counted: dict[CallKey, tuple[EngineHandle, bool, CallRunner]] = {}  # running: engine, is latency
        self._tasks: dict[CallKey, asyncio.Task[None]] = {}  # the latest task of each call
        self._freeing: dict[CallKey, asyncio.Task[None]] = {}  # context frees in flight
        self._order = itertools.count()
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self.num_steps = 0

    def start(self) -> None:
        self._loop_task = asyncio.get_running_loop().create_task(self._loop(), name="parrot-graph-executor")

    async def stop(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
            self._loop_task = None

    # --- events ---------------------------------------------------------------------------------

    def add_calls(self, session: Session, calls: Iterable[CallNode]) -> None:
        for call in calls:
            call.order = next(self._order)
            key = (session.session_id, call.call_id)
            self._waiting[key] = (session, call)
            self._dirty.add(key)
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
                key = (session.session_id, call_id)
                if key in self._waiting:
                    self._dirty.add(key)
        self._wake.set()

    def _output_set(self, session: Session, var: Variable) -> None:
        self.variables_set(session, [var])

    def engine_died(self, engine_id: str) -> None:
        """Forget the engine's prefixes; its early-filled calls start over and its running calls
        are stopped and dispatched again elsewhere."""
        if self.prefixes is not None:
            self.prefixes.drop_engine(engine_id)
        for key, runner in list(self._runners.items()):
            if runner.engine.engine_id != engine_id:
                continue
            runner.engine_lost = True
            if runner.task is not None and not runner.task.done():
                runner.task.cancel()  # its early fill or run sees engine_lost
            if key in self._waiting:
                self._start_over(key)
        self._wake.set()

    def _start_over(self, key: CallKey) -> None:
        """A waiting call's early work is lost: forget its runner; it may go anywhere now."""
        self._retire(key)
        call = self._waiting[key][1]
        call.engine_id, call.num_fill_requested = None, 0
        self._dirty.add(key)
        self._wake.set()

    async def drop_session(self, session: Session) -> None:
        """Forget the session's calls, cancel their work and free their engine contexts."""
        sid = session.session_id
        self._deduce.pop(sid, None)
        for key in [k for k in self._waiting if k[0] == sid]:
            del self._waiting[key]
            self._views.drop(key)
            self._dirty.discard(key)
        tasks = [t for k, t in self._tasks.items() if k[0] == sid]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        # Early-filled calls that never ran still hold a context.
        for key in [k for k in self._runners if k[0] == sid]:
            self._retire(key)
        self._wake.set()

    async def drain(self) -> None:
        """Until every context free in flight is done (frees wait for generations to end)."""
        await asyncio.gather(*self._freeing.values(), return_exceptions=True)

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
        for key in self._dirty:
            entry = self._waiting.get(key)
            if entry is not None:
                self._views.update(key, *entry, self._runners.get(key))
        self._dirty.clear()
        plan = self.policy.plan(self.snapshot())
        self._apply(plan)
        return plan

    def _deduce_objectives(self, session: Session) -> None:
        deduce = self.config.objective_deduction
        for call_id in apply_deductions(session.graph, self.config.default_objective, deduce):
            key = (session.session_id, call_id)
            if key in self._waiting:
                self._dirty.add(key)

    def snapshot(self) -> Snapshot:
        running = [(key, handle.engine_id, runner.call) for key, (handle, _, runner) in self._counted.items()]
        return self._views.snapshot(running)

    # --- applying a plan --------------------------------------------------------------------------

    def _apply(self, plan: Plan) -> None:
        for fail in plan.fail:
            session, call = self._take(fail.key)
            var = session.graph.variables[fail.var_id]
            assert var.error is not None
            name = next(n for n, v in call.inputs.items() if v == fail.var_id)
            error = ParrotError(
                f"input {name!r} of call {call.call_id} failed: {var.error.message}", status=424, field=var.error.field
            )
            self._finish(session, call, error)
            if fail.key in self._runners:
                self._chain(fail.key, functools.partial(self._retire_after, fail.key))
        for fill in plan.early_fill:
            session, call = self._waiting[fill.key]
            runner = self._runner(session, call, fill.engine_id)
            if not runner.counts_as_early_filled:
                runner.counts_as_early_filled = True
                runner.engine.num_early_filled_calls += 1
            call.num_fill_requested = fill.num_pieces
            self._dirty.add(fill.key)
            self._chain(fill.key, functools.partial(self._early_fill, fill.key, runner, fill.num_pieces))
        for dispatch in plan.dispatch:
            session, call = self._take(dispatch.key)
            engine = self.pool.handles[dispatch.engine_id]
            runner = self._runner(session, call, dispatch.engine_id)
            if runner.counts_as_early_filled:
                runner.counts_as_early_filled = False
                runner.engine.num_early_filled_calls -= 1
            is_latency = call.objective is Objective.LATENCY
            engine.num_running_calls += 1
            engine.num_latency_calls += is_latency
            self._counted[dispatch.key] = (engine, is_latency, runner)
            call.state = CallState.RUNNING
            call.engine_id = dispatch.engine_id
            call.dispatched_at = time.monotonic()
            task = self._chain(dispatch.key, functools.partial(self._run, session, runner, engine))
            task.add_done_callback(functools.partial(self._uncount_when_done, dispatch.key, runner))

    def _uncount_when_done(self, key: CallKey, runner: CallRunner, _: asyncio.Task[None]) -> None:
        self._uncount(key, runner)

    def _uncount(self, key: CallKey, runner: CallRunner) -> None:
        """The run of `runner` ended: its engine has room again (a later run of the call keeps its own)."""
        counted = self._counted.get(key)
        if counted is not None and counted[2] is runner:
            del self._counted[key]
            engine, is_latency, _ = counted
            engine.num_running_calls -= 1
            engine.num_latency_calls -= is_latency
            self._wake.set()

    def _take(self, key: CallKey) -> tuple[Session, CallNode]:
        self._views.drop(key)
        self._dirty.discard(key)
        return self._waiting.pop(key)

    def _runner(self, session: Session, call: CallNode, engine_id: str) -> CallRunner:
        key = (session.session_id, call.call_id)
        runner = self._runners.get(key)
        if runner is None:
            call.engine_id = engine_id
            runner = CallRunner(
                session.session_id,
                call,
                session.graph.variables,
                self.pool.handles[engine_id],
                functools.partial(self._output_set, session),
                self.prefixes,
            )
            self._runners[key] = runner
        return runner

    def _chain(self, key: CallKey, work: Callable[[], Awaitable[None]]) -> asyncio.Task[None]:
        """Run `work` after the call's previous task, whatever that task's outcome."""
        prev = self._tasks.get(key)

        async def chained() -> None:
            if prev is not None and not prev.done():
                await asyncio.wait([prev])
            await work()

        task = asyncio.get_running_loop().create_task(chained())
        self._tasks[key] = task
        task.add_done_callback(lambda t: self._tasks.pop(key) if self._tasks.get(key) is t else None)
        return task

    async def _early_fill(self, key: CallKey, runner: CallRunner, num_pieces: int) -> None:
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
            if key not in self._waiting or self._runners.get(key) is not runner:
                return  # dispatched meanwhile (the run refills and reports) or started over
            if isinstance(e, EngineUnavailable):
                self.on_engine_error(runner.engine.engine_id)
                self._start_over(key)
                return
            session, call = self._take(key)
            self._finish(session, call, ParrotError(f"call {call.call_id} failed: {e.message}", status=e.status))
            self._retire(key)

    async def _run(self, session: Session, runner: CallRunner, engine: EngineHandle) -> None:
        call = runner.call
        runner.task = asyncio.current_task()
        error: ParrotError | None = None
        try:
            if runner.engine is not engine:  # the early fill went elsewhere
                await runner.rebind(engine, self.config.free_timeout_s)
            if runner.engine_lost:
                raise EngineUnavailable(f"engine {engine.engine_id} died before call {call.call_id} ran")
            await runner.run()
        except EngineUnavailable as e:
            if self._requeue(session, runner):
                return
            error = e
        except ParrotError as e:
            error = e
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if runner.engine_lost and task is not None and self._requeue(session, runner):
                task.uncancel()
                return
            self._end(session, runner, ParrotError(f"call {call.call_id} was cancelled", status=410))
            raise
        except Exception as e:  # an engine bug: the call fails, the manager keeps serving
            log.exception("call %s failed", runner.context_id)
            error = ParrotError(f"internal error in call {call.call_id}: {e}", status=500)
        self._end(session, runner, error)

    def _end(self, session: Session, runner: CallRunner, error: ParrotError | None) -> None:
        call = runner.call
        if error is not None:
            error = ParrotError(f"call {call.call_id} failed: {error.message}", status=error.status, field=error.field)
        self._finish(session, call, error)
        self._retire((session.session_id, call.call_id))

    def _requeue(self, session: Session, runner: CallRunner) -> bool:
        """Put a call whose engine stopped answering back to waiting; False if out of attempts."""
        call = runner.call
        key = (session.session_id, call.call_id)
        call.num_attempts += 1
        if call.num_attempts >= self.config.max_call_attempts:
            return False
        if any(session.graph.variables[v].error is not None for v in call.outputs.values()):
            return False  # its session was deleted meanwhile
        log.warning("engine %s lost call %s; dispatching it again", runner.engine.engine_id, runner.context_id)
        self.on_engine_error(runner.engine.engine_id)
        self._retire(key)
        self._uncount(key, runner)
        call.state = CallState.WAITING
        call.engine_id, call.num_fill_requested, call.dispatched_at = None, 0, None
        call.num_prompt_tokens = call.num_cached_tokens = 0
        self._waiting[key] = (session, call)
        self._dirty.add(key)
        self._wake.set()
        return True

    def _finish(self, session: Session, call: CallNode, error: ParrotError | None) -> None:
        call.state = CallState.DONE if error is None else CallState.FAILED
        call.finished_at = time.monotonic()
        if error is not None:
            failed = []
            for var_id in call.outputs.values():
                var = session.graph.variables[var_id]
                if not var.is_done:
                    var.fail(error)
                    failed.append(var)
            self.variables_set(session, failed)
        self._wake.set()

    def _retire(self, key: CallKey) -> None:
        """Drop the call's runner and free its context in a task of its own, which cancelling the
        call does not interrupt (the free waits for the engine's work on the context to end)."""
        runner = self._runners.pop(key, None)
        if runner is None:
            return
        if runner.counts_as_early_filled:
            runner.counts_as_early_filled = False
            runner.engine.num_early_filled_calls -= 1
        task = asyncio.get_running_loop().create_task(runner.free(self.config.free_timeout_s))
        self._freeing[key] = task
        task.add_done_callback(lambda t: self._freeing.pop(key, None) if self._freeing.get(key) is t else None)

    async def _retire_after(self, key: CallKey) -> None:
        self._retire(key)


__all__ = ["CallView", "GraphExecutor"]
