"""The manager (the paper's ServeCore): the one object behind the public API.

Owns the session registry, the engine pool and the graph executor, and is the only writer of
sessions and their graphs (everything runs on one asyncio event loop, so no locks). Every method
that changes state first checks the whole request and raises ParrotError naming the field, so a
bad request changes nothing.

Construct with `create_manager(engines, tokenizer_folder, config)`, then `await manager.start()`
(create_app's lifespan does) and `await manager.stop()`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from parrot.protocol.engine_api import LeaseRequest
from parrot.protocol.engine_client import EngineClient, EngineUnavailable
from parrot.protocol.errors import ParrotError, conflict, not_found
from parrot.protocol.objective import Criteria
from parrot.protocol.public_api import (
    CallInfo,
    CallSpec,
    CreateSessionRequest,
    SessionCreated,
    SessionStatus,
    SubmitRequest,
    SubmitResponse,
    VariableInfo,
    VariableList,
    VariableSpec,
    VariableState,
    VariableValue,
)
from parrot.protocol.template import ParsedTemplate
from parrot.serve.clock import REAL_CLOCK, Clock
from parrot.serve.config import ManagerConfig
from parrot.serve.runtime.batches import batch_chars, check_awaited, parse_calls, stage_batch, submitted, tokenize_batch
from parrot.serve.runtime.call_log import log_finished
from parrot.serve.runtime.call_run import CallRun
from parrot.serve.runtime.contexts import PrefixContexts
from parrot.serve.runtime.engines import EngineHandle, EnginePool
from parrot.serve.runtime.executor import GraphExecutor
from parrot.serve.runtime.graph import CallNode, StagedBatch
from parrot.serve.runtime.health import HealthMonitor
from parrot.serve.runtime.metrics import ServeMetrics
from parrot.serve.runtime.prefix_cache import PrefixCache
from parrot.serve.runtime.session import Session, SessionRegistry
from parrot.serve.runtime.status import session_status
from parrot.serve.runtime.variable import Variable

log = logging.getLogger(__name__)

_OFFLOAD_CHARS = 64 * 1024  # a batch with more text than this is tokenized on a worker thread


class Manager:
    def __init__(
        self,
        engines: Sequence[EngineClient],
        tokenizer_folder: str | Path | None = None,
        config: ManagerConfig | None = None,
        clock: Clock = REAL_CLOCK,
    ) -> None:
        self.config = config or ManagerConfig()
        self.clock = clock  # every time the scheduling path reads or waits on (clock.py)
        # This run: in its context ids (a restarted manager never names an old run's context, and an
        # engine frees a dead run's by its lease) and session tokens (an old one is told it was lost).
        self.run_id = secrets.token_hex(4)
        self.pool = EnginePool(engines, tokenizer_folder, clock)
        self.sessions = SessionRegistry(self.config, self.run_id, clock)
        self.prefix_cache = PrefixCache()
        self.prefixes = (
            PrefixContexts(self.prefix_cache, self.config, self.run_id, clock)
            if self.config.sharing.prefix_sharing
            else None
        )
        lease = LeaseRequest(
            prefixes=[f"s-{self.run_id}-", f"pfx-{self.run_id}-"], ttl_s=self.config.engines.context_lease_s
        )
        self.health = HealthMonitor(self.pool, self.config, self._engine_died, self._engine_stats, lease)
        self.executor = GraphExecutor(self.pool, self.config, self.prefixes, self.health.suspect)
        self.metrics = ServeMetrics(self.sessions, self.pool, self.prefix_cache)  # GET /metrics
        self.executor.on_finish = self._call_finished
        self._expiry_task: asyncio.Task[None] | None = None
        self.draining = False  # shutting down: no new sessions or calls (503)

    def _call_finished(self, session: Session, run: CallRun) -> None:
        self.metrics.call_finished(run)
        log_finished(session.session_id, run)

    async def start(self) -> None:
        await self.pool.start()
        for handle in self.pool.alive:  # the lease on this run's contexts before any exists
            self.metrics.engine_added(handle.engine_id)
            await self.health.renew_lease(handle)
        self.executor.start()
        self.health.start()
        self._expiry_task = asyncio.get_running_loop().create_task(self._expire_loop(), name="parrot-session-expiry")

    async def drain_in_flight(self, grace_s: float | None = None) -> int:
        """Stop admitting work (503); wait up to `grace_s` for no call in flight; return those left."""
        self.draining = True
        deadline = self.clock.now() + (self.config.lifecycle.shutdown_grace_s if grace_s is None else grace_s)
        while (num := self.executor.num_in_flight()) and self.clock.now() < deadline:
            await self.clock.sleep(0.05)
        if num:
            log.warning("shutting down with %d calls still in flight: they end with 410", num)
        return num

    async def close_sessions(self) -> None:
        """Close every session: pending gets and streams end with a 410 error, contexts free."""
        self.draining = True
        for session in list(self.sessions.sessions.values()):
            await self.delete_session(session, "closed: the manager stopped")

    def _admit(self) -> None:
        if self.draining:
            raise ParrotError("the manager is shutting down: no new work is accepted", status=503)

    async def stop(self) -> None:
        if self._expiry_task is not None:
            self._expiry_task.cancel()
            await asyncio.gather(self._expiry_task, return_exceptions=True)
        await self.health.stop()
        await self.close_sessions()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.executor.drain(), timeout=10.0)
        if self.prefixes is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.prefixes.clear(self.pool.handles), timeout=10.0)
        await self.executor.stop()
        await self.pool.close_clients()

    # --- engines ----------------------------------------------------------------------------------

    async def add_engine(
        self, client: EngineClient, max_running_calls: int | None = None, url: str | None = None
    ) -> EngineHandle:
        """Register an engine while serving; it takes calls from the next scheduling step."""
        if url is not None and any(h.url == url and h.alive for h in self.pool.handles.values()):
            raise conflict(f"engine {url!r} is registered already", field="url")
        try:
            handle = await self.pool.add(client, max_running_calls, url)
        except EngineUnavailable as e:
            raise ParrotError(f"cannot reach the engine: {e.message}", status=400, field="url") from e
        self.health.calibrate(handle)
        self.metrics.engine_added(handle.engine_id)
        await self.health.renew_lease(handle)  # before it holds any context of ours
        self.executor.engines_changed()
        return handle

    async def remove_engine(self, engine_id: str) -> EngineHandle:
        """Stop scheduling onto an engine (operator's request): as on its death, then close its client."""
        if (handle := self.pool.handles.get(engine_id)) is None:
            raise not_found("engine", engine_id, "engine_id")
        self.health.declare_dead(handle, "removed by an operator")
        del self.pool.handles[engine_id]
        self.executor.engines_changed()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.executor.drain(), timeout=10.0)  # frees on it end first
        await self.pool.close_clients([handle])
        return handle

    def _engine_died(self, handle: EngineHandle) -> None:
        self.executor.engine_died(handle.engine_id)

    def _engine_stats(self, handle: EngineHandle) -> None:
        self.metrics.heartbeat(handle.engine_id)
        if self.prefixes is not None:
            self.prefixes.relieve(handle)
        self.executor.engines_changed()

    async def drain(self) -> None:
        """Until the engine contexts of finished or deleted calls are all freed."""
        await self.executor.drain()

    # --- sessions ---------------------------------------------------------------------------------

    def create_session(self, api_key: str | None, idle_timeout_s: float | None = None) -> SessionCreated:
        self._admit()
        session, token = self.sessions.create(self.sessions.tenant_of(api_key), idle_timeout_s)
        return SessionCreated(session_id=session.session_id, token=token, idle_timeout_s=session.idle_timeout_s)

    async def open_session(self, api_key: str | None, req: CreateSessionRequest) -> SessionCreated:
        """A session, with its first batch when `req.submit` holds one (one request instead of
        two): all or nothing, a refused batch leaves no session (its errors name `submit.` fields)."""
        created = self.create_session(api_key, req.idle_timeout_s)
        if req.submit is None:
            return created
        session = self.sessions.sessions[created.session_id]
        try:
            submitted = await self.submit_async(session, req.submit, "submit.calls")
        except BaseException as e:  # a refusal, or the client left: no session stays behind
            await self.delete_session(session, "refused with its first batch")
            if isinstance(e, ParrotError) and e.field and not e.field.startswith("submit."):
                e.field = f"submit.{e.field}"
            raise
        return created.model_copy(update={"submitted": submitted})

    def session(self, session_id: str, token: str | None) -> Session:
        """The session, if `token` is its token (401/403/404/410 otherwise)."""
        return self.sessions.authenticate(token, session_id)

    async def delete_session(self, session: Session, why: str = "deleted") -> None:
        """Wake its waiting gets with an error, cancel its calls and free their engine contexts."""
        if self.sessions.remove(session.session_id, why) is None:
            return
        error = ParrotError(f"session {session.session_id!r} was {why}", status=410, field="session_id")
        for var in session.graph.variables.values():
            var.fail(error)
        await self.executor.drop_session(session)

    def status(self, session: Session) -> SessionStatus:
        return session_status(session)

    async def _expire_loop(self) -> None:
        while True:
            await self.clock.sleep(self.config.lifecycle.expiry_interval_s)
            for session in self.sessions.expired():
                log.info("session %s expired", session.session_id)
                await self.delete_session(session, f"expired after {session.idle_timeout_s:g} s idle")

    # --- calls ------------------------------------------------------------------------------------

    def submit(self, session: Session, req: SubmitRequest, call_field_prefix: str = "calls") -> SubmitResponse:
        """Create the batch's variables, then its calls; all or nothing."""
        self._admit()
        check_awaited(req, session.graph.variables)
        parsed = parse_calls(req.calls, self.pool, call_field_prefix)
        staged = self._submit(session, req.variables, parsed, call_field_prefix)
        self.note_awaited(session, req.awaited)
        return submitted(staged)

    def submit_call(self, session: Session, spec: CallSpec) -> CallInfo:
        return self.submit(session, SubmitRequest(calls=[spec]), call_field_prefix="").calls[0]

    def submit_parsed(
        self,
        session: Session,
        specs: Sequence[CallSpec],
        template: ParsedTemplate,
        message_prefix_ids: Sequence[list[int]] = (),
        prompt_token_ids: list[int] | None = None,
    ) -> list[CallNode]:
        """A plain request (the OpenAI routes): its one text piece is the raw prompt, never parsed
        for placeholders. `message_prefix_ids`: the leading chat messages' tokens (prefix points at
        message boundaries). `prompt_token_ids`: the piece's tokens as the client sent them, or as
        the route tokenized its text off the event loop (never re-tokenized). A client waits on the
        answer: its output is latency-critical. Several `specs` (OpenAI's `n`: one per choice, same model) share the
        prompt: with prefix sharing it is filled once and each call forks it (batches.py)."""
        staged = [(spec, template, self.pool.resolve_model(spec.model)) for spec in specs]
        calls = self._submit(session, [], staged, "", message_prefix_ids, prompt_token_ids, len(specs) > 1).calls
        self.note_awaited(session, {next(iter(c.outputs.values())): Criteria.LATENCY for c in calls})
        return calls

    def _submit(
        self,
        session: Session,
        var_specs: Sequence[VariableSpec],
        calls: Sequence[tuple[CallSpec, ParsedTemplate, str]],
        prefix: str,
        message_prefix_ids: Sequence[list[int]] | None = None,
        prompt_token_ids: list[int] | None = None,
        shared_prompt: bool = False,
    ) -> StagedBatch:
        self._check_admissible(session, len(calls))
        staged, variables = stage_batch(session, var_specs, calls, prefix, self.config)
        tokenize_batch(staged, variables, self.pool, prefix, message_prefix_ids, prompt_token_ids, shared_prompt)
        return self._commit(session, staged)

    async def submit_async(
        self, session: Session, req: SubmitRequest, call_field_prefix: str = "calls"
    ) -> SubmitResponse:
        """`submit` for the HTTP routes: a batch with much text is tokenized on a worker thread,
        so the event loop (other sessions, health checks) keeps answering meanwhile."""
        if batch_chars(req.variables, req.calls) <= _OFFLOAD_CHARS:
            return self.submit(session, req, call_field_prefix)
        self._admit()
        check_awaited(req, session.graph.variables)
        parsed = parse_calls(req.calls, self.pool, call_field_prefix)
        self._check_admissible(session, len(parsed))
        session.submitting = True
        try:
            staged, variables = stage_batch(session, req.variables, parsed, call_field_prefix, self.config)
            await asyncio.to_thread(tokenize_batch, staged, variables, self.pool, call_field_prefix)
            if self.sessions.sessions.get(session.session_id) is not session:
                raise ParrotError(f"session {session.session_id!r} was closed meanwhile", status=410)
            self._commit(session, staged)
            self.note_awaited(session, req.awaited)  # before the executor's next step dispatches
        finally:
            session.submitting = False
        return submitted(staged)

    def cancel_call(self, session: Session, call_id: str) -> None:
        """Cancel an unfinished call (executor.cancel); 404 for an unknown call, 409 a finished one."""
        run = session.runs.get(call_id)
        if run is None:
            raise not_found("call", call_id, field="call_id")
        if run.finished_at is not None:
            raise conflict(f"call {call_id!r} has finished ({run.state}): nothing to cancel", field="call_id")
        self.executor.cancel(session, run)

    def _check_admissible(self, session: Session, num_new: int) -> None:
        """409 while another batch of the session is being tokenized; 429 past the tenant's calls."""
        if session.submitting:
            raise conflict("another batch of this session is being submitted; retry when it is in", "session_id")
        self.sessions.check_tenant_load(session.tenant, num_calls=num_new)

    def _commit(self, session: Session, staged: StagedBatch) -> StagedBatch:
        self.sessions.admit(session, staged)  # 429 past the tenant's tokens in flight; counts what it holds
        session.graph.commit(staged)
        self.executor.add_calls(session, staged.calls)
        return staged

    # --- variables --------------------------------------------------------------------------------

    def create_variable(self, session: Session, spec: VariableSpec) -> VariableInfo:
        return self._submit(session, [spec], [], "calls").variables[0].info()

    def variable(self, session: Session, var_id: str) -> Variable:
        var = session.graph.variables.get(var_id)
        if var is None:
            raise not_found("variable", var_id, field="var_id")
        return var

    def set_variable(self, session: Session, var_id: str, value: str | None, error: str | None = None) -> VariableInfo:
        """Set an input once, to a value or (a failed client-side computation) to an error."""
        var = self.variable(session, var_id)
        if var.producer_call_id is not None:
            raise conflict(
                f"variable {var_id!r} is the output of call {var.producer_call_id}; only it sets it", "var_id"
            )
        if var.is_done:
            raise conflict(f"variable {var_id!r} is already set", field="value")
        if value is not None:
            session.check_chars(len(value), self.config.limits.max_chars_per_session, "value")
            var.set(value)
            session.num_chars += len(value)
        else:
            var.fail(ParrotError(f"variable {var_id!r} was set to an error by the client: {error}", status=424))
        self.executor.variables_set(session, [var])
        return var.info()

    async def get_variable(
        self,
        session: Session,
        var_id: str,
        criteria: Criteria = Criteria.LATENCY,
        timeout_s: float = 60.0,
        counted: bool = True,
    ) -> VariableValue:
        """The value once ready; the variable's own error if it failed; 408 after `timeout_s`.
        `counted=False`: within a request already counted in variable_gets (a run's later outputs)."""
        var = self.variable(session, var_id)
        self.note_criteria(session, var, criteria)
        if counted:
            self.metrics.variable_get()
        with session.waiting():
            await var.wait(timeout_s)
        if var.error is not None:
            raise var.error
        return VariableValue(var_id=var_id, state=VariableState.READY, value=var.value, scores=var.scores)

    async def stream_variable(
        self, session: Session, var_id: str, criteria: Criteria = Criteria.LATENCY, timeout_s: float = 600.0
    ) -> AsyncIterator[str]:
        """Text chunks as they are generated; raises the variable's error if it fails."""
        var = self.variable(session, var_id)
        self.note_criteria(session, var, criteria)
        self.metrics.variable_get()
        var.watched = True  # now, not at the generator's first step: a dispatch may come in between
        return session.stream(var, timeout_s)

    def note_criteria(self, session: Session, var: Variable, criteria: Criteria) -> None:
        """A get asked for `var` with `criteria`: the session's objectives are deduced again.
        Latency wins: one person waiting is enough to make the value latency-critical."""
        if var.criteria is not Criteria.LATENCY and var.criteria is not criteria:
            var.criteria = criteria
            self.executor.criteria_changed(session)

    def note_awaited(self, session: Session, awaited: dict[str, Criteria]) -> None:
        """Gets about to come for these variables (`SubmitRequest.awaited`, a run's outputs)."""
        for var_id, criteria in awaited.items():
            self.note_criteria(session, self.variable(session, var_id), criteria)

    def list_variables(self, session: Session) -> VariableList:
        return VariableList(variables=[v.info() for v in session.graph.variables.values()])


def create_manager(
    engines: Sequence[EngineClient],
    tokenizer_folder: str | Path | None = None,
    config: ManagerConfig | None = None,
    clock: Clock = REAL_CLOCK,
) -> Manager:
    """A manager over `engines` (in-process AsyncEngine or HttpEngineClient); start it with
    `await manager.start()` (create_app's lifespan does). `tokenizer_folder` defaults to each
    engine's own model folder."""
    return Manager(engines, tokenizer_folder, config, clock)
