"""The graph executor: releases calls onto engines as their inputs become ready.

Owns every not-yet-dispatched call (across sessions), the runners of placed calls and their tasks.
Event-driven: a new call, a set variable or a finished call marks calls dirty and wakes one loop,
which (1) recomputes the dirty calls' views, (2) asks the policy for a plan on the snapshot and
(3) applies the plan. Only step 3 has effects, so the decision logic stays pure (scheduler.py).

Because a consumer's release needs only its producer's output variable, a whole DAG submitted at
once runs level after level with no client round trip. The tasks of one call run one after another
(an early fill, then the run), so a call's context never sees two of our requests at once.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from parrot.protocol.errors import ParrotError
from parrot.serve.analysis import failed_input, inputs_ready, num_ready_pieces
from parrot.serve.call_runner import CallRunner
from parrot.serve.config import ManagerConfig
from parrot.serve.engines import EnginePool
from parrot.serve.graph import CallNode, CallState
from parrot.serve.scheduler import CallKey, CallView, EngineView, Plan, Snapshot, make_policy
from parrot.serve.session import Session
from parrot.serve.variable import Variable

log = logging.getLogger(__name__)


class GraphExecutor:
    def __init__(self, pool: EnginePool, config: ManagerConfig) -> None:
        self.pool = pool
        self.config = config
        self.policy = make_policy(config.policy)
        self._waiting: dict[CallKey, tuple[Session, CallNode]] = {}
        self._views: dict[CallKey, CallView] = {}
        self._dirty: set[CallKey] = set()
        self._runners: dict[CallKey, CallRunner] = {}
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

    async def drop_session(self, session: Session) -> None:
        """Forget the session's calls, cancel their work and free their engine contexts."""
        sid = session.session_id
        for key in [k for k in self._waiting if k[0] == sid]:
            del self._waiting[key]
            self._views.pop(key, None)
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
        for key in self._dirty:
            entry = self._waiting.get(key)
            if entry is not None:
                self._views[key] = _view(key, *entry)
        self._dirty.clear()
        plan = self.policy.plan(self.snapshot())
        self._apply(plan)
        return plan

    def snapshot(self) -> Snapshot:
        engines = tuple(
            EngineView(
                h.engine_id,
                h.model,
                h.num_running_calls,
                self.config.max_running_calls_per_engine,
                h.num_early_filled_calls,
                self.config.max_early_filled_calls_per_engine,
            )
            for h in self.pool.handles.values()
        )
        return Snapshot(tuple(self._views.values()), engines, self.config.early_fill)

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
            runner = self._runner(session, call, dispatch.engine_id)
            if runner.counts_as_early_filled:
                runner.counts_as_early_filled = False
                runner.engine.num_early_filled_calls -= 1
            runner.engine.num_running_calls += 1
            call.state = CallState.RUNNING
            call.dispatched_at = time.monotonic()
            self._chain(dispatch.key, functools.partial(self._run, session, runner))

    def _take(self, key: CallKey) -> tuple[Session, CallNode]:
        self._views.pop(key, None)
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
            )
            self._runners[key] = runner
        return runner

    def _chain(self, key: CallKey, work: Callable[[], Awaitable[None]]) -> None:
        """Run `work` after the call's previous task, whatever that task's outcome."""
        prev = self._tasks.get(key)

        async def chained() -> None:
            if prev is not None and not prev.done():
                await asyncio.wait([prev])
            await work()

        task = asyncio.get_running_loop().create_task(chained())
        self._tasks[key] = task
        task.add_done_callback(lambda t: self._tasks.pop(key) if self._tasks.get(key) is t else None)

    async def _early_fill(self, key: CallKey, runner: CallRunner, num_pieces: int) -> None:
        try:
            await runner.fill_to(num_pieces)
        except ParrotError as e:
            if key not in self._waiting:
                return  # dispatched meanwhile: the run refills and reports
            session, call = self._take(key)
            self._finish(session, call, ParrotError(f"call {call.call_id} failed: {e.message}", status=e.status))
            self._retire(key)

    async def _run(self, session: Session, runner: CallRunner) -> None:
        call = runner.call
        key = (session.session_id, call.call_id)
        error: ParrotError | None = None
        try:
            await runner.run()
        except ParrotError as e:
            error = e
        except asyncio.CancelledError:
            error = ParrotError(f"call {call.call_id} was cancelled", status=410)
            raise
        except Exception as e:  # an engine bug: the call fails, the manager keeps serving
            log.exception("call %s failed", runner.context_id)
            error = ParrotError(f"internal error in call {call.call_id}: {e}", status=500)
        finally:
            runner.engine.num_running_calls -= 1
            if error is not None:
                error = ParrotError(
                    f"call {call.call_id} failed: {error.message}", status=error.status, field=error.field
                )
            self._finish(session, call, error)
            self._retire(key)

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
        if runner.has_context:
            task = asyncio.get_running_loop().create_task(runner.free(self.config.free_timeout_s))
            self._freeing[key] = task
            task.add_done_callback(lambda t: self._freeing.pop(key, None))

    async def _retire_after(self, key: CallKey) -> None:
        self._retire(key)


def _view(key: CallKey, session: Session, call: CallNode) -> CallView:
    variables = session.graph.variables
    failed = failed_input(call, variables)
    return CallView(
        key=key,
        model=call.model,
        order=call.order,
        inputs_ready=inputs_ready(call, variables),
        failed_var_id=None if failed is None else failed.var_id,
        num_ready_pieces=num_ready_pieces(call, variables),
        num_filled_pieces=call.num_fill_requested,
        engine_id=call.engine_id,
    )
