"""Sessions: one application run on a Parrot server, as a context manager, sync or asyncio.

    with Session("http://127.0.0.1:8000", api_key="...") as s:
        summary = summarize(doc)          # semantic functions find the active session
        print(summary.get())

    async with AsyncSession(url, api_key=...) as s:
        print(await summarize(doc).aget())

`AsyncSession` is the session, on the caller's loop. `Session` is a thin wrapper for synchronous
code: it owns an event loop running in a background thread and runs its AsyncSession's coroutines
there, each sync method waiting for its async twin (bridge.py). Calls are queued in the caller's
thread (core.py) and sent in batches from the loop, so plain synchronous code submits thousands of
calls without a thread hop each and without blocking on the network.

`api_key` is the tenant's key; without one no `Authorization` header is sent (a manager with no
keys configured, development mode, takes that). `max_retries` and `backoff_s` set the transport's
retries of transient faults (transport.py). Leaving the block sends what is queued and deletes the
session on the server (freeing its contexts).

Entering the block sends nothing: the session is created on the server with its first batch of
calls (core.py), so a wrong API key or an unreachable manager is raised by the first read of a
variable (or by `open()`, which creates the session at once: call it to check them up front).
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, TypeVar

from parrot.frontend.bridge import is_running, run_blocking
from parrot.frontend.core import SessionCore, current_core
from parrot.frontend.transport import ApiTransport, end_of_loop
from parrot.frontend.variable import SemanticVariable
from parrot.protocol.errors import ParrotError
from parrot.protocol.public_api import SessionStatus, VariableList

T = TypeVar("T")


class AsyncSession:
    core: SessionCore  # made on the loop that first uses the session (`_bind`)

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        idle_timeout_s: float | None = None,
        batch_size: int = 512,
        max_retries: int = 4,
        backoff_s: float = 0.25,
    ) -> None:
        self._max_retries = max_retries
        self._backoff_s = backoff_s
        self._base_url = base_url
        self._api_key = api_key
        self._idle_timeout_s = idle_timeout_s
        self._batch_size = batch_size
        self._token: contextvars.Token[SessionCore | None] | None = None

    async def __aenter__(self) -> AsyncSession:
        self._bind(asyncio.get_running_loop())
        self._activate()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._deactivate()
        await self.close()

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Make the session's core on `loop`, where its requests will run (once)."""
        if not hasattr(self, "core"):
            transport = ApiTransport(self._base_url, max_retries=self._max_retries, backoff_s=self._backoff_s)
            self.core = SessionCore(transport, loop, self._batch_size, self._api_key, self._idle_timeout_s)

    def _activate(self) -> None:
        """Make this the session that semantic functions called in the caller's context use."""
        self._token = current_core.set(self.core)

    def _deactivate(self) -> None:
        if self._token is not None:
            current_core.reset(self._token)
            self._token = None

    @property
    def session_id(self) -> str:
        """The server's id of this session: created there by the first batch or `open()`."""
        if not self.core.session_id:
            message = "this session is not created on the server yet: `await session.open()` first"
            raise ParrotError(message, status=409, field="session_id")
        return self.core.session_id

    def variable(self, name: str | None = None, value: str | None = None) -> SemanticVariable:
        """A new variable of this session: an input to `set` later, or already set to `value`."""
        return self.core.new_variable(name, value)

    async def open(self) -> None:
        """Create the session on the server now (it is otherwise created with its first batch)."""
        self._bind(asyncio.get_running_loop())
        await self.core.open()

    async def close(self) -> None:
        await self.core.close()

    async def flush(self) -> None:
        """Until every queued call and variable has reached the server."""
        await self.core.flush()

    async def status(self) -> SessionStatus:
        return await (await self._synced()).status()

    async def list_variables(self) -> VariableList:
        return await (await self._synced()).list_variables()

    async def _synced(self) -> ApiTransport:
        """The transport, once what is queued has reached the server and the session exists there."""
        await self.core.flush()
        await self.core.open()
        return self.core.transport


class Session:
    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        idle_timeout_s: float | None = None,
        batch_size: int = 512,
        max_retries: int = 4,
        backoff_s: float = 0.25,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="parrot-session", daemon=True)
        self._thread.start()
        self._async = AsyncSession(
            base_url,
            api_key,
            idle_timeout_s=idle_timeout_s,
            batch_size=batch_size,
            max_retries=max_retries,
            backoff_s=backoff_s,
        )
        self._async._bind(self._loop)

    @property
    def core(self) -> SessionCore:
        return self._async.core

    def __enter__(self) -> Session:
        self._async._activate()  # in the caller's context, not the loop's
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._async._deactivate()
        self.close()

    @property
    def session_id(self) -> str:
        """The server's id of this session, created there now if it is not yet (on the session's
        own loop, where waiting would hang it, ParrotError 409 instead)."""
        if not self.core.session_id and not is_running(self._loop):
            self.open()
        return self._async.session_id

    def variable(self, name: str | None = None, value: str | None = None) -> SemanticVariable:
        """A new variable of this session: an input to `set` later, or already set to `value`."""
        return self._async.variable(name, value)

    def open(self) -> None:
        """Create the session on the server now (it is otherwise created with its first batch)."""
        self._run(self._async.open())

    def close(self) -> None:
        """Send what is queued, delete the session on the server, stop the loop (once)."""
        if self._loop.is_closed():
            return
        try:
            self._run(self._async.close())
        finally:
            try:
                self._run(end_of_loop())  # its loop stops without cancelling the connections' linger
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join()
                self._loop.close()

    def flush(self) -> None:
        """Block until every queued call and variable has reached the server."""
        self._run(self._async.flush())

    def status(self) -> SessionStatus:
        return self._run(self._async.status())

    def list_variables(self) -> VariableList:
        return self._run(self._async.list_variables())

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return run_blocking(self._loop, coro)
