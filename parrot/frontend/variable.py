"""SemanticVariable: the client's handle on a Semantic Variable, a future produced once, read by many.

A variable is created at once, in the client, when a function is called or `session.variable()` is
asked for; its creation reaches the server with the next batch. Reading it (`get`, `aget`,
`stream`, `astream`) waits on the server; `set` gives an input its value. The sync methods may be
called from any thread except the session's own event loop (there, use the `a...` forms).

`str(var)` is a marker naming the variable (markers.py): text holding it, given to a semantic
call's input, makes the variable that input's dependency. A typed output (`Output(schema=Model)`)
reads as the parsed value; `stream` always yields the text. `cancel` stops the call producing it.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, Generic, Protocol, cast

from typing_extensions import TypeVar

from parrot.frontend.markers import VarRef, marker
from parrot.protocol.errors import ParrotError
from parrot.protocol.objective import Criteria

T = TypeVar("T")
V = TypeVar("V", default=str)  # what `get` returns: the text, or a typed output's parsed value
_END = object()


class VariableOwner(Protocol):
    """What a variable needs of its session (core.SessionCore implements it): the event loop its
    requests run on, and the three requests on one variable."""

    loop: asyncio.AbstractEventLoop
    key: str  # the session's client-side key: markers name it

    async def get(self, var: SemanticVariable[Any], criteria: Criteria, timeout: float | None) -> str: ...

    def stream(self, var: SemanticVariable[Any], criteria: Criteria) -> AsyncIterator[str]: ...

    async def set(self, var: SemanticVariable[Any], value: str) -> None: ...

    async def cancel(self, var: SemanticVariable[Any]) -> None: ...


class SemanticVariable(Generic[V]):
    def __init__(self, core: VariableOwner, var_id: str, name: str | None, seq: int, value: str | None = None) -> None:
        self._core = core
        self.var_id = var_id
        self.name = name
        self._seq = seq  # queue position of the last operation that defines it (creation, or its call)
        self._value = value  # known locally: set by this client, or read once
        self._error: ParrotError | None = None  # its creation was refused
        self._call_id: str | None = None  # the call producing it, once the server named it
        self._parse: Callable[[str], Any] | None = None  # a typed output's parser
        self._scores: dict[str, float] | None = None  # a scored select's, once read

    def __str__(self) -> str:
        return marker(self._core.key, self.var_id)

    @property
    def ref(self) -> VarRef:
        return VarRef(self._core.key, self.var_id)

    def __repr__(self) -> str:
        state = "ready" if self._value is not None else "pending"
        return f"SemanticVariable({self.var_id!r}, name={self.name!r}, {state})"

    @property
    def scores(self) -> dict[str, float] | None:
        """A scored `select`'s log-probability of each option given the prompt, once the value was
        read (`get`); None for any other output."""
        return self._scores

    @property
    def is_known(self) -> bool:
        """The value is already in this client (no request needed to read it)."""
        return self._value is not None

    # --- reading ----------------------------------------------------------------------------------

    def get(self, criteria: Criteria | str = Criteria.LATENCY, timeout: float | None = None) -> V:
        """Block until the value is ready and return it (a typed output's parsed value); raises the
        variable's ParrotError if its producer failed, and ParrotError(408) after `timeout` seconds."""
        return self.parsed(self._run(self._core.get(self, Criteria(criteria), timeout)))

    async def aget(self, criteria: Criteria | str = Criteria.LATENCY, timeout: float | None = None) -> V:
        return self.parsed(await self._arun(self._core.get(self, Criteria(criteria), timeout)))

    def parsed(self, text: str) -> V:
        """`text` as this variable reads: parsed for a typed output (ParrotError 502 naming the
        output if it does not parse), else as it is."""
        return cast(V, text if self._parse is None else self._parse(text))

    async def astream(self, criteria: Criteria | str = Criteria.LATENCY) -> AsyncIterator[str]:
        """Text chunks as the producer generates them (the whole value at once if already set)."""
        if asyncio.get_running_loop() is self._core.loop:
            async for chunk in self._core.stream(self, Criteria(criteria)):
                yield chunk
            return
        chunks: asyncio.Queue[object] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        self._forward(lambda item: loop.call_soon_threadsafe(chunks.put_nowait, item), Criteria(criteria))
        while (item := await chunks.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, str)
            yield item

    def stream(self, criteria: Criteria | str = Criteria.LATENCY) -> Iterator[str]:
        """`astream` for synchronous code."""
        self._check_not_on_loop()
        chunks: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._forward(chunks.put, Criteria(criteria))
        while (item := chunks.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, str)
            yield item

    def _forward(self, put: Any, criteria: Criteria) -> None:
        async def pump() -> None:
            try:
                async for chunk in self._core.stream(self, criteria):
                    put(chunk)
            except BaseException as e:  # delivered to the reader, which re-raises it
                put(e)
            put(_END)

        self._check_open()
        asyncio.run_coroutine_threadsafe(pump(), self._core.loop)

    # --- writing ----------------------------------------------------------------------------------

    def set(self, value: str) -> None:
        """Give this input its value (once; 409 if it is set already or is a call's output)."""
        self._run(self._core.set(self, value))

    async def aset(self, value: str) -> None:
        await self._arun(self._core.set(self, value))

    # --- cancelling -------------------------------------------------------------------------------

    def cancel(self) -> None:
        """Cancel the call producing this variable: its outputs fail (410), its engine work stops
        and its context is freed; consumers fail (424). 409 if it finished already."""
        self._run(self._core.cancel(self))

    async def acancel(self) -> None:
        await self._arun(self._core.cancel(self))

    # --- bridging to the session's loop -----------------------------------------------------------

    def _check_not_on_loop(self) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            return
        if running is self._core.loop:
            raise RuntimeError("a blocking call on the session's own event loop: use `await var.aget()` / `aset`")

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            self._check_not_on_loop()
            self._check_open()
        except BaseException:
            coro.close()
            raise
        return asyncio.run_coroutine_threadsafe(coro, self._core.loop).result()

    async def _arun(self, coro: Coroutine[Any, Any, T]) -> T:
        if asyncio.get_running_loop() is self._core.loop:
            return await coro
        try:
            self._check_open()
        except BaseException:
            coro.close()
            raise
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._core.loop))

    def _check_open(self) -> None:
        if self._core.loop.is_closed():
            raise ParrotError(f"variable {self.var_id!r}: its session is closed", status=410, field="session_id")
