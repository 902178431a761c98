"""Engine health: heartbeats, dead-engine detection, capacity calibration and memory relief.

Owned by the manager; runs on its event loop. Every `heartbeat_interval_s` it asks each live engine
for its stats (within `heartbeat_timeout_s`). An answer refreshes the engine's handle: its stats,
its latency cap calibrated from its step profile (capacity.py), and its memory (idle cached
prefixes are evicted when free KV blocks run low, contexts.py). An engine silent for
`engine_dead_after_s` is declared dead: it is never scheduled again, and `on_dead` drops its cached
prefixes and re-dispatches its calls. A call that finds its engine unreachable asks for a probe at
once (`suspect`): the engine gets no new work until it answers, and one that refuses the
connection is dead without waiting the interval. Each answer also renews, every quarter of its
ttl, the lease under which the engine holds this run's contexts (a dead manager's are freed).

The manager pulls heartbeats (engines need not know the manager's address); an engine registers by
URL through the manager's API or is given at startup.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable

from parrot.protocol.engine_api import LeaseRequest
from parrot.protocol.engine_client import EngineUnavailable
from parrot.protocol.errors import ParrotError
from parrot.serve.config import ManagerConfig
from parrot.serve.policy.capacity import calibrate_latency_cap
from parrot.serve.runtime.engines import EngineHandle, EnginePool

log = logging.getLogger(__name__)


class HealthMonitor:
    def __init__(
        self,
        pool: EnginePool,
        config: ManagerConfig,
        on_dead: Callable[[EngineHandle], None],
        on_stats: Callable[[EngineHandle], None] = lambda handle: None,
        lease: LeaseRequest | None = None,
    ) -> None:
        self.pool = pool
        self.config = config
        self.on_dead = on_dead
        self.on_stats = on_stats
        self.lease = lease  # renewed on every live engine each quarter of its ttl
        self._lease_renewed: dict[str, float] = {}  # engine_id -> when
        self._task: asyncio.Task[None] | None = None
        self._probes: dict[str, asyncio.Task[bool]] = {}

    def start(self) -> None:
        for handle in self.pool.handles.values():
            self.calibrate(handle)
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="parrot-health")

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._probes.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._task = None

    def calibrate(self, handle: EngineHandle) -> None:
        max_cap = handle.max_running_calls or self.config.scheduling.max_running_calls_per_engine
        handle.latency_cap = self.config.scheduling.latency_cap_calls or calibrate_latency_cap(
            handle.stats.step_ms_by_num_tokens,
            self.config.scheduling.tpot_target_ms,
            fallback=self.config.scheduling.initial_latency_cap_calls,
            max_cap=max_cap,
            floor_slack=self.config.scheduling.tpot_floor_slack,
        )

    async def _loop(self) -> None:
        while True:
            await self.pool.clock.sleep(self.config.engines.heartbeat_interval_s)
            await asyncio.gather(*(self.probe(h) for h in self.pool.alive), return_exceptions=True)

    def suspect(self, engine_id: str) -> None:
        """A call could not reach the engine: probe it now (one probe at a time per engine)."""
        handle = self.pool.handles.get(engine_id)
        if handle is None or not handle.alive or engine_id in self._probes:
            return
        handle.suspected = True
        task = asyncio.get_running_loop().create_task(self.probe(handle, suspected=True))
        self._probes[engine_id] = task
        task.add_done_callback(lambda _: self._probes.pop(engine_id, None))

    async def probe(self, handle: EngineHandle, suspected: bool = False) -> bool:
        """One heartbeat; True if the engine answered."""
        if not handle.alive:
            return False
        try:
            async with asyncio.timeout(self.config.engines.heartbeat_timeout_s):
                stats = await handle.client.stats()
        except (ParrotError, TimeoutError, OSError) as e:
            refused = suspected and isinstance(e, EngineUnavailable)
            silent_s = self.pool.clock.now() - handle.last_heartbeat
            if refused or silent_s >= self.config.engines.engine_dead_after_s:
                self.declare_dead(handle, f"{type(e).__name__}: {e}")
            return False
        handle.stats = stats
        handle.last_heartbeat = self.pool.clock.now()
        handle.suspected = False
        self.calibrate(handle)
        await self.renew_lease(handle)
        try:
            self.on_stats(handle)
        except Exception:  # a bug in eviction must not kill the heartbeat
            log.exception("handling the stats of engine %s failed", handle.engine_id)
        return True

    async def renew_lease(self, handle: EngineHandle) -> None:
        """Renew this run's context lease on the engine if a quarter of its ttl has passed (or
        never renewed there); a failure is logged and the next heartbeat tries again."""
        if self.lease is None:
            return
        now = self.pool.clock.now()
        if now - self._lease_renewed.get(handle.engine_id, -math.inf) < self.lease.ttl_s / 4:
            return
        try:
            async with asyncio.timeout(self.config.engines.heartbeat_timeout_s):
                await handle.client.renew_lease(self.lease)
            self._lease_renewed[handle.engine_id] = now
        except (ParrotError, TimeoutError, OSError) as e:  # the next heartbeat tries again
            log.warning("renewing the context lease on engine %s failed: %s", handle.engine_id, e)

    def declare_dead(self, handle: EngineHandle, why: str) -> None:
        if not handle.alive:
            return
        handle.alive = False
        log.warning("engine %s (%s) is dead: %s", handle.engine_id, handle.url or handle.model, why)
        self.on_dead(handle)
