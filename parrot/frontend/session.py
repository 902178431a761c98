"""Sessions: one application run on a Parrot server, as a context manager, sync or asyncio.

    with Session("http://127.0.0.1:8000", api_key="...") as s:
        summary = summarize(doc)          # semantic functions find the active session
        print(summary.get())

    async with AsyncSession(url, api_key=...) as s:
        print(await summarize(doc).aget())

`Session` runs the SDK's event loop in a background thread, so plain synchronous code can submit
thousands of calls without blocking on the network; `AsyncSession` uses the caller's loop.
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

from parrot.frontend.core import SessionCore, current_core
from parrot.frontend.transport import ApiTransport, end_of_loop
from parrot.frontend.variable import SemanticVariable
from parrot.protocol.errors import ParrotError
from parrot.protocol.public_api import SessionStatus, VariableList

T = TypeVar("T")


class _SessionBase:
    core: SessionCore
    _token: contextvars.Token[SessionCore | None] | None = None

    @property
    def session_id(self) -> str:
        """The server's id of this session: created there by the first batch or `open()`."""
        if not self.core.session_id:
            self._open_for_id()
        return self.core.session_id

    def _open_for_id(self) -> None:
        message = "this session is not created on the server yet: `await session.open()` first"
        raise ParrotError(message, status=409, field="session_id")

    def variable(self, name: str | None = None, value: str | None = None) -> SemanticVariable:
        """A new variable of this session: an input to `set` later, or already set to `value`."""
        return self.core.new_variable(name, value)

    def _activate(self) -> None:
        self._token = current_core.set(self.core)

    def _deactivate(self) -> None:
        if self._token is not None:
            current_core.reset(self._token)
            self._token = None


class Session(_SessionBase):
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
        transport = ApiTransport(base_url, max_retries=max_retries, backoff_s=backoff_s)
        self.core = SessionCore(transport, self._loop, batch_size, api_key, idle_timeout_s)

    def __enter__(self) -> Session:
        self._activate()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._deactivate()
        self.close()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._run(self.core.close())
        finally:
            try:
                self._run(end_of_loop())  # its loop stops without cancelling the connections' linger
            finally:
                self._stop_loop()

    def open(self) -> None:
        """Create the session on the server now (it is otherwise created with its first batch)."""
        self._run(self.core.open())

    def _open_for_id(self) -> None:
        if threading.current_thread() is self._thread:  # on the session's own loop: blocking would hang it
            super()._open_for_id()
        self.open()

    def flush(self) -> None:
        """Block until every queued call and variable has reached the server."""
        self._run(self.core.flush())

    def status(self) -> SessionStatus:
        return self._run(self._status())

    def list_variables(self) -> VariableList:
        return self._run(self._list())

    async def _status(self) -> SessionStatus:
        await self.core.flush()
        await self.core.open()
        return await self.core.transport.status()

    async def _list(self) -> VariableList:
        await self.core.flush()
        await self.core.open()
        return await self.core.transport.list_variables()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


class AsyncSession(_SessionBase):
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

    async def __aenter__(self) -> AsyncSession:
        self._start()
        self._activate()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._deactivate()
        await self.close()

    def _start(self) -> None:
        if not hasattr(self, "core"):
            transport = ApiTransport(self._base_url, max_retries=self._max_retries, backoff_s=self._backoff_s)
            loop = asyncio.get_running_loop()
            self.core = SessionCore(transport, loop, self._batch_size, self._api_key, self._idle_timeout_s)

    async def open(self) -> None:
        """Create the session on the server now (it is otherwise created with its first batch)."""
        self._start()
        await self.core.open()

    async def close(self) -> None:
        await self.core.close()

    async def flush(self) -> None:
        await self.core.flush()

    async def status(self) -> SessionStatus:
        await self.core.flush()
        await self.core.open()
        return await self.core.transport.status()

    async def list_variables(self) -> VariableList:
        await self.core.flush()
        await self.core.open()
        return await self.core.transport.list_variables()
