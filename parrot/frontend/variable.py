"""SemanticVariable: the client's handle on a Semantic Variable, a future produced once, read by many.

A variable is created at once, in the client, when a function is called or `session.variable()` is
asked for; its creation reaches the server with the next batch. Reading it (`get`, `aget`,
`stream`, `astream`) waits on the server; `set` gives an input its value. Each operation is written
once, as its async form on the session's loop; the sync form runs that there and waits
(bridge.py), so it may be called from any thread except the session's own event loop (there, use
the `a...` forms).

`str(var)` is a marker naming the variable (markers.py): text holding it, given to a semantic
call's input, makes the variable that input's dependency. A typed output (`Output(schema=Model)`)
reads as the parsed value; `stream` always yields the text. `cancel` stops the call producing it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, Generic, Protocol, cast

from typing_extensions import TypeVar

from parrot.frontend.bridge import iterate_blocking, iterate_on, run_blocking, run_on
from parrot.frontend.markers import VarRef, marker
from parrot.protocol.errors import ParrotError
from parrot.protocol.objective import Criteria

T = TypeVar("T")
V = TypeVar("V", default=str)  # what `get` returns: the text, or a typed output's parsed value


class VariableOwner(Protocol):
    """What a variable needs of its session (core.SessionCore implements it): the event loop its
    requests run on, and the four requests on one variable."""

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
        return self._blocking(self.aget(criteria, timeout))

    async def aget(self, criteria: Criteria | str = Criteria.LATENCY, timeout: float | None = None) -> V:
        return self.parsed(await self._on_loop(self._core.get(self, Criteria(criteria), timeout)))

    def parsed(self, text: str) -> V:
        """`text` as this variable reads: parsed for a typed output (ParrotError 502 naming the
        output if it does not parse), else as it is."""
        return cast(V, text if self._parse is None else self._parse(text))

    def stream(self, criteria: Criteria | str = Criteria.LATENCY) -> Iterator[str]:
        """`astream` for synchronous code."""
        self._check_open()
        yield from iterate_blocking(self._core.loop, self.astream(criteria))

    async def astream(self, criteria: Criteria | str = Criteria.LATENCY) -> AsyncIterator[str]:
        """Text chunks as the producer generates them (the whole value at once if already set)."""
        self._check_open()
        async for chunk in iterate_on(self._core.loop, self._core.stream(self, Criteria(criteria))):
            yield chunk

    # --- writing ----------------------------------------------------------------------------------

    def set(self, value: str) -> None:
        """Give this input its value (once; 409 if it is set already or is a call's output)."""
        self._blocking(self.aset(value))

    async def aset(self, value: str) -> None:
        await self._on_loop(self._core.set(self, value))

    # --- cancelling -------------------------------------------------------------------------------

    def cancel(self) -> None:
        """Cancel the call producing this variable: its outputs fail (410), its engine work stops
        and its context is freed; consumers fail (424). 409 if it finished already."""
        self._blocking(self.acancel())

    async def acancel(self) -> None:
        await self._on_loop(self._core.cancel(self))

    # --- the session's loop (bridge.py) -----------------------------------------------------------

    def _blocking(self, coro: Coroutine[Any, Any, T]) -> T:
        """One of the async forms, run on the session's loop while this thread waits."""
        return run_blocking(self._core.loop, self._opened(coro))

    async def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        return await run_on(self._core.loop, self._opened(coro))

    def _opened(self, coro: Coroutine[Any, Any, T]) -> Coroutine[Any, Any, T]:
        """`coro` if the session is open; else it is closed unstarted and ParrotError(410) raised."""
        try:
            self._check_open()
        except BaseException:
            coro.close()
            raise
        return coro

    def _check_open(self) -> None:
        if self._core.loop.is_closed():
            raise ParrotError(f"variable {self.var_id!r}: its session is closed", status=410, field="session_id")
