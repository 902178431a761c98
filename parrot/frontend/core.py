"""The SDK's session engine room: one event loop, an operation queue, batching, native calls.

Creating a variable or calling a function only appends an operation to the queue (from any
thread) and returns; a single flusher task on the session's loop sends the queue in order, as
`/submit` batches, while the application keeps submitting. So thousands of calls cost a handful of
requests, and the first call leaves at once (the server can start while the rest are declared).
A refused batch fails the variables it created: reading them raises the server's error.

The session is created on the server with its first batch (`POST /v1/sessions` carrying it: one
request instead of two), or by the first request that needs it without one (`open`). Until then
it has no server id; markers name variables by the session's client-side `key` (markers.py). So a
one-call application costs three requests (create with its call, get, delete), and a session that
sent nothing costs none; a refused key or an unreachable manager is reported by that first
request (reading the batch's variables raises it).

Native functions run here, in the client: a task awaits the inputs, runs the function (in a
thread if it is synchronous) and sets the output variable; the server never runs client code.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import itertools
import logging
import secrets
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import aiohttp

from parrot.frontend.transport import ApiTransport
from parrot.frontend.variable import SemanticVariable
from parrot.protocol.errors import ParrotError
from parrot.protocol.objective import Criteria
from parrot.protocol.public_api import MAX_GET_TIMEOUT_S, CallSpec, SubmitRequest, SubmitResponse, VariableSpec

log = logging.getLogger(__name__)

current_core: contextvars.ContextVar[SessionCore | None] = contextvars.ContextVar("parrot_session", default=None)


class SessionCore:
    def __init__(
        self,
        transport: ApiTransport,
        loop: asyncio.AbstractEventLoop,
        batch_size: int = 512,
        api_key: str | None = None,
        idle_timeout_s: float | None = None,
    ) -> None:
        self.transport = transport
        self.loop = loop
        self.batch_size = batch_size
        self._api_key = api_key
        self._idle_timeout_s = idle_timeout_s
        self._opening = asyncio.Lock()  # one creation of the session on the server
        self.key = secrets.token_hex(8)  # names the session in markers, before and after it is created
        self._lock = threading.Lock()  # guards the queue and the counters below
        self._queue: list[tuple[VariableSpec | CallSpec, list[SemanticVariable]]] = []
        self._num_queued = 0
        self._num_sent = 0
        self._num_taken = 0  # operations the flusher has taken from the queue (sent or on their way)
        self._kick_pending = False
        # Queued variables a reader waits for, with its criteria: they go with their batch
        # (SubmitRequest.awaited), so the server deduces objectives with them before dispatching.
        self._awaited: dict[str, Criteria] = {}
        self._sent = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._natives: set[asyncio.Future[None]] = set()
        self._var_ids = itertools.count()
        self._vars: weakref.WeakValueDictionary[str, SemanticVariable] = weakref.WeakValueDictionary()

    @property
    def session_id(self) -> str:
        """The server's id of the session ("" until it is created there)."""
        return self.transport.session_id

    async def open(self) -> None:
        """Create the session on the server now, if it is not yet (a request that needs it)."""
        if not self.session_id:
            await self._create(None)

    async def _create(self, batch: SubmitRequest | None) -> SubmitResponse | None:
        """Create the session with `batch` as its first (or, if it exists meanwhile, submit it)."""
        async with self._opening:
            if self.session_id:
                return None if batch is None else await self.transport.submit(batch)
            created = await self.transport.create_session(self._api_key, self._idle_timeout_s, batch)
            return created.submitted

    async def close(self) -> None:
        """Send what is queued, stop native calls still waiting, delete the session (if it was
        created: a session that sent nothing costs no request)."""
        try:
            await self.flushed(self._num_queued)
            for native in list(self._natives):
                native.cancel()
            await asyncio.gather(*self._natives, return_exceptions=True)
            if self.session_id:
                await self.transport.delete_session()
        finally:
            await self.transport.aclose()

    # --- queueing (any thread) --------------------------------------------------------------------

    def new_variable(self, name: str | None = None, value: str | None = None) -> SemanticVariable:
        var_id = f"v{next(self._var_ids)}"
        with self._lock:
            seq = self._num_queued + 1
            var = SemanticVariable(self, var_id, name, seq, value)
            self._push(VariableSpec(var_id=var_id, name=name, value=value), [var])
            self._vars[var_id] = var
        return var

    def lookup(self, var_id: str) -> SemanticVariable:
        """The variable `var_id` of this session (e.g. named by a marker in text): its object while
        the application holds it, else a new handle whose reads wait for everything queued now."""
        var = self._vars.get(var_id)
        if var is not None:
            return var
        with self._lock:
            return SemanticVariable(self, var_id, None, self._num_queued)

    def submit_call(self, spec: CallSpec, outputs: list[SemanticVariable]) -> None:
        self.submit_calls([(spec, outputs)])

    def submit_calls(self, calls: list[tuple[CallSpec, list[SemanticVariable]]]) -> None:
        """Queue calls together: they reach the server in one batch (the queue is not sent between
        them), so it sees them all when it plans the first (prefix sharing)."""
        with self._lock:
            for spec, outputs in calls:
                self._push(spec, outputs)
                for var in outputs:
                    var._seq = self._num_queued  # reading an output waits for its call to be sent

    def _push(self, op: VariableSpec | CallSpec, vars_: list[SemanticVariable]) -> None:
        self._queue.append((op, vars_))
        self._num_queued += 1
        if not self._kick_pending:
            self._kick_pending = True
            self.loop.call_soon_threadsafe(self._ensure_flusher)

    # --- sending (the loop) -----------------------------------------------------------------------

    def _ensure_flusher(self) -> None:
        with self._lock:
            self._kick_pending = False
            pending = bool(self._queue)
        if pending and (self._flusher is None or self._flusher.done()):
            self._flusher = self.loop.create_task(self._flush_loop())

    async def _flush_loop(self) -> None:
        while True:
            with self._lock:
                batch = self._queue[: self.batch_size]
                del self._queue[: len(batch)]
                self._num_taken += len(batch)
                in_batch = {v.var_id for _, vars_ in batch for v in vars_}
                awaited = {v: c for v, c in self._awaited.items() if v in in_batch}
                self._awaited = {v: c for v, c in self._awaited.items() if v not in in_batch}
            if not batch:
                return
            try:
                req = _as_request(batch, awaited)
                submitted = await self.transport.submit(req) if self.session_id else await self._create(req)
                assert submitted is not None
                outputs = [vars_ for op, vars_ in batch if isinstance(op, CallSpec)]
                for info, vars_ in zip(submitted.calls, outputs, strict=True):
                    for var in vars_:
                        var._call_id = info.call_id
            except (ParrotError, aiohttp.ClientError) as e:
                error = e if isinstance(e, ParrotError) else ParrotError(f"submit failed: {e}", status=503)
                log.warning("a batch of %d operations was refused: %s", len(batch), error.message)
                for _, vars_ in batch:
                    for var in vars_:
                        var._error = error
            with self._lock:
                self._num_sent += len(batch)
            self._sent.set()
            self._sent = asyncio.Event()

    def take_batch(self) -> SubmitRequest:
        """Everything queued, as one batch this core will never send (`SemanticFunction.arun`
        sends it in a run of its own); must be called on the loop before it runs the flusher."""
        with self._lock:
            batch, self._queue = self._queue, []
            self._num_taken += len(batch)
            self._num_sent += len(batch)
        return _as_request(batch, {})

    async def flushed(self, seq: int) -> None:
        """Until the first `seq` queued operations have been sent (or refused)."""
        while True:
            with self._lock:
                if self._num_sent >= seq:
                    return
            self._ensure_flusher()
            await self._sent.wait()

    def _await_soon(self, var: SemanticVariable, criteria: Criteria) -> None:
        """A reader will wait for `var`: if its batch is still queued, the batch says so."""
        with self._lock:  # still queued: not taken by the flusher (a batch taken may be on its way)
            if self._num_taken < var._seq and self._awaited.get(var.var_id) is not Criteria.LATENCY:
                self._awaited[var.var_id] = criteria  # latency wins, as on the server

    async def flush(self) -> None:
        await self.flushed(self._num_queued)

    # --- reading and writing variables (the loop) -------------------------------------------------

    async def get(self, var: SemanticVariable, criteria: Criteria, timeout: float | None) -> str:
        if var._value is not None:
            return var._value
        await self._readable(var, criteria)
        deadline = None if timeout is None else self.loop.time() + timeout
        while True:
            wait_s = MAX_GET_TIMEOUT_S if deadline is None else min(MAX_GET_TIMEOUT_S, deadline - self.loop.time())
            try:
                got = await self.transport.get_variable(var.var_id, criteria, max(wait_s, 0.001))
            except ParrotError as e:
                if e.status == 408 and (deadline is None or self.loop.time() < deadline):
                    continue  # our long poll ended; the caller's timeout has not
                raise
            assert got.value is not None
            var._value, var._scores = got.value, got.scores
            return got.value

    async def stream(self, var: SemanticVariable, criteria: Criteria) -> AsyncIterator[str]:
        if var._value is not None:
            yield var._value
            return
        await self._readable(var, criteria)
        async for chunk in self.transport.stream_variable(var.var_id, criteria):
            yield chunk

    async def set(self, var: SemanticVariable, value: str) -> None:
        if not isinstance(value, str):
            raise ParrotError(f"a variable's value is text, not {type(value).__name__}", field="value")
        await self._defined(var)
        await self.open()
        await self.transport.set_variable(var.var_id, value)
        var._value = value

    async def cancel(self, var: SemanticVariable) -> None:
        await self._defined(var)
        if var._call_id is None:
            raise ParrotError(f"variable {var.var_id!r} is no call's output: nothing to cancel", field="var_id")
        await self.transport.cancel_call(var._call_id)

    async def _defined(self, var: SemanticVariable) -> None:
        """Until the operation defining `var` was sent; its batch's error if the server refused it."""
        await self.flushed(var._seq)
        if var._error is not None:
            raise var._error

    async def _readable(self, var: SemanticVariable, criteria: Criteria) -> None:
        """Until `var` can be read on the server: defined there (its batch saying a reader waits, if
        still queued), in a session that exists there."""
        self._await_soon(var, criteria)
        await self._defined(var)
        await self.open()

    # --- native calls -----------------------------------------------------------------------------

    def run_native(self, fn: Callable[..., Any], args: Mapping[str, Any], out: SemanticVariable) -> None:
        """Schedule `fn(**values)` once the input variables are ready; its result sets `out`."""
        context = contextvars.copy_context()  # nested calls inside `fn` find this session

        async def run() -> None:
            try:
                values = {k: (await v.aget() if isinstance(v, SemanticVariable) else v) for k, v in args.items()}
                if inspect.iscoroutinefunction(fn):
                    result = await fn(**values)
                else:
                    result = await asyncio.to_thread(fn, **values)
                await self.set(out, result if isinstance(result, str) else str(result))
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the failure reaches every consumer of `out`
                message = e.message if isinstance(e, ParrotError) else f"{type(e).__name__}: {e}"
                await self.flushed(out._seq)
                await self.open()
                await self.transport.set_variable(out.var_id, None, error=f"native {_name(fn)} failed: {message}")

        def start() -> None:
            task = self.loop.create_task(run(), context=context)
            self._natives.add(task)
            task.add_done_callback(self._natives.discard)

        self.loop.call_soon_threadsafe(start)


def _as_request(
    batch: list[tuple[VariableSpec | CallSpec, list[SemanticVariable]]], awaited: dict[str, Criteria]
) -> SubmitRequest:
    """Queued operations as one batch: its variables, its calls (each in queue order), `awaited`."""
    variables = [op for op, _ in batch if isinstance(op, VariableSpec)]
    calls = [op for op, _ in batch if isinstance(op, CallSpec)]
    return SubmitRequest(variables=variables, calls=calls, awaited=awaited)


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", repr(fn))
