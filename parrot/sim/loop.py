"""A virtual-time asyncio event loop: its `time()` is a counter that jumps to the next timer when
nothing is ready, so `asyncio.sleep`, `asyncio.timeout` and `call_later` run in virtual seconds and
a run takes only the CPU time its callbacks take.

How: a selector wrapper. Each loop iteration asks the selector to wait `timeout` seconds (the time
to the next timer, or 0 when callbacks are ready). The wrapper polls the real selector without
blocking (the loop's self-pipe, sockets) and, when nothing arrived, advances virtual time by
`timeout` instead of waiting. With no timer at all (`timeout=None`) it blocks on the real selector
for `idle_wait_s` of wall time (a worker thread may still wake the loop, e.g. `asyncio.to_thread`),
then raises `VirtualDeadlock`: nothing could ever run again.

Owns nothing of the manager; `parrot.serve.clock.LoopClock` reads this loop's time.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class VirtualDeadlock(RuntimeError):
    """The virtual loop had no ready callback, no timer and no I/O: the program waits forever."""


class _VirtualSelector(selectors.BaseSelector):
    def __init__(self, idle_wait_s: float) -> None:
        self._inner = selectors.DefaultSelector()
        self.idle_wait_s = idle_wait_s
        self.now = 0.0

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = self._inner.select(0)
        if events or timeout == 0:
            return events
        if timeout is None:
            events = self._inner.select(self.idle_wait_s)
            if not events:
                raise VirtualDeadlock("nothing is ready, no timer is set and no I/O arrived: a deadlock")
            return events
        self.now += timeout
        return []

    def close(self) -> None:
        self._inner.close()

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._inner.get_map()


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock starts at 0.0 and moves only when the loop would otherwise wait."""

    def __init__(self, idle_wait_s: float = 5.0) -> None:
        self._virtual = _VirtualSelector(idle_wait_s)
        super().__init__(self._virtual)
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._virtual.now


def run_virtual(main: Coroutine[Any, Any, T], idle_wait_s: float = 5.0) -> T:
    """`asyncio.run` on a fresh virtual-time loop."""
    with asyncio.Runner(loop_factory=lambda: VirtualTimeLoop(idle_wait_s)) as runner:
        return runner.run(main)
