"""Context leases: a manager holds its contexts on this engine by renewing a lease on their id
prefixes; once a lease runs out, the engine frees that lease's contexts as soon as no work is
queued on them (a dead manager's contexts come back). Contexts no lease names stay until freed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from parrot.protocol.engine_api import FreeContextRequest, LeaseRequest
from parrot.protocol.errors import ParrotError

log = logging.getLogger(__name__)


class LeaseTable:
    """Lease deadlines by id prefix (pure bookkeeping; the clock is given)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.deadlines: dict[str, float] = {}

    def renew(self, req: LeaseRequest) -> None:
        until = self.clock() + req.ttl_s
        for prefix in req.prefixes:
            self.deadlines[prefix] = max(until, self.deadlines.get(prefix, until))

    def expired(self) -> tuple[str, ...]:
        now = self.clock()
        return tuple(p for p, until in self.deadlines.items() if until <= now)

    def drop(self, prefix: str) -> None:
        self.deadlines.pop(prefix, None)


class LeaseKeeper:
    """Frees the contexts of expired leases, every `sweep_s`, while any lease is held."""

    def __init__(
        self,
        context_ids: Callable[[tuple[str, ...]], list[str]],
        free: Callable[[FreeContextRequest], None],
        sweep_s: float = 1.0,
    ) -> None:
        self.table = LeaseTable()
        self._context_ids, self._free, self.sweep_s = context_ids, free, sweep_s
        self._task: asyncio.Task[None] | None = None

    def renew(self, req: LeaseRequest) -> None:
        self.table.renew(req)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._sweep_loop(), name="parrot-leases")

    def sweep(self) -> int:
        """Free the contexts of expired leases (a busy one when its work ends); a lease none of
        whose contexts is left ends. Returns how many contexts were freed or will be."""
        num_freed = 0
        for prefix in self.table.expired():
            left = 0
            for context_id in self._context_ids((prefix,)):
                try:
                    self._free(FreeContextRequest(context_id=context_id))
                    num_freed += 1
                except ParrotError:  # gone already
                    left += 1
            if left == 0:
                self.table.drop(prefix)
        if num_freed:
            log.info("freed %d contexts of expired leases", num_freed)
        return num_freed

    async def _sweep_loop(self) -> None:
        while self.table.deadlines:
            await asyncio.sleep(self.sweep_s)
            self.sweep()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
