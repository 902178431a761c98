"""The manager's clock: every time the scheduling path reads or waits on goes through one `Clock`.

The manager is given a clock (default `REAL_CLOCK`, the monotonic wall clock) and hands it to the
parts that read time (session idleness, heartbeats, aging, prefix LRU, call timing) or sleep (the
heartbeat and expiry loops). Timeouts (`asyncio.timeout`) read the event loop's own time, so a
clock must agree with the loop it runs on: the simulator (`parrot.sim`) runs the manager on an
event loop whose time is virtual and gives it a clock that reads that loop's time.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic scale (only differences mean anything)."""
        ...

    async def sleep(self, delay_s: float) -> None:
        """Wait `delay_s` seconds of this clock's time."""
        ...


class MonotonicClock:
    """Real time: `time.monotonic()` and `asyncio.sleep` (the default event loop's time is the same)."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)


class LoopClock:
    """The running event loop's time: virtual on a virtual-time loop, monotonic on a normal one."""

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)


REAL_CLOCK: Clock = MonotonicClock()
