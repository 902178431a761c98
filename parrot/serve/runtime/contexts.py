"""Cluster context management for prefix sharing: cached prefix contexts on the engines.

Owned by the manager; every method runs on its event loop. The index is prefix_cache.PrefixCache,
the decisions are pure functions (prefix.choose_cache_points, prefix_cache.plan_evictions); this
module does their engine I/O: an Extend without sampling for each new prefix context (forked from
the longest shorter one already cached), a Free for each evicted one.

Contracts:
- `lease()` returns once the leased entry's context holds its prefix; the lease keeps the entry
  from eviction until `release()`. A call forks its own context from the leased context.
- Each prefix is filled once per engine: concurrent callers wait on the one fill in flight.
- An entry whose fill fails leaves the index; its waiters see the error (EngineUnavailable when
  the engine did not answer, so the executor re-dispatches the call).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from parrot.protocol.engine_api import ExtendRequest, FreeContextRequest
from parrot.protocol.engine_client import EngineClient, EngineUnavailable, extend_only
from parrot.protocol.errors import ParrotError
from parrot.protocol.objective import Objective
from parrot.serve.clock import REAL_CLOCK, Clock
from parrot.serve.config import ManagerConfig
from parrot.serve.policy.prefix import (
    PointKind,
    PrefixPoint,
    block_boundaries,
    choose_cache_points,
    prefix_points,
)
from parrot.serve.runtime.engines import EngineHandle
from parrot.serve.runtime.graph import CallNode
from parrot.serve.runtime.prefix_cache import EntryState, MemoryView, PrefixCache, PrefixEntry, plan_evictions
from parrot.serve.runtime.render import render_prompt
from parrot.serve.runtime.variable import Variable
from parrot.text import Tokenizer

log = logging.getLogger(__name__)


@dataclass
class Lease:
    entry: PrefixEntry
    hit_tokens: int  # tokens of the prompt that were cached before this call asked

    def reuse(self, owner: str) -> tuple[int, int]:
        """(tokens other calls computed, tokens `owner` computed in an early fill) of the leased
        prefix, as a fork from it reuses them (its last token the fork computes itself)."""
        others = early = 0
        entry: PrefixEntry | None = self.entry
        while entry is not None:
            if entry.created_for != owner:
                others += entry.num_computed_tokens
            elif entry.created_early:
                early += entry.num_computed_tokens
            entry = entry.parent
        return others, early


def prompt_points(
    call: CallNode, variables: Mapping[str, Variable], tokenizer: Tokenizer, stop: int, block_tokens: int
) -> tuple[list[int], tuple[PrefixPoint, ...]]:
    """The token ids of pieces[:stop] (all known) that may be filled now (render.render_prompt) and
    their prefix points; cached on the call (values never change once set)."""
    key = (id(tokenizer), stop, block_tokens)
    cached = call.points.get(key)
    if cached is None:
        cached = call.points[key] = _prompt_points(call, variables, tokenizer, stop, block_tokens)
    return cached


def _prompt_points(
    call: CallNode, variables: Mapping[str, Variable], tokenizer: Tokenizer, stop: int, block_tokens: int
) -> tuple[list[int], tuple[PrefixPoint, ...]]:
    prompt = render_prompt(call, variables, tokenizer, stop)
    token_ids = prompt.token_ids
    if call.message_boundaries is None:
        boundaries = [(n, PointKind.VARIABLE) for n in prompt.boundaries]
    else:
        boundaries = [(n, PointKind.MESSAGE) for n in call.message_boundaries if 0 < n <= len(token_ids)]
        boundaries += block_boundaries(len(token_ids), block_tokens)
    return token_ids, prefix_points(call.model, token_ids, boundaries)


async def free_engine_context(client: EngineClient, context_id: str) -> None:
    """Free a context with one request: an engine frees a context that still has work queued
    (a generation whose reader went away, a fork waiting to read it) when that work ends, so
    there is nothing to wait for or retry."""
    try:
        await client.free(FreeContextRequest(context_id=context_id))
    except EngineUnavailable:
        return  # a dead engine holds nothing
    except ParrotError as e:
        if e.status != 404:  # 404: never created (its fill was refused)
            log.warning("context %s not freed: %s", context_id, e.message)


class PrefixContexts:
    def __init__(self, cache: PrefixCache, config: ManagerConfig, run_id: str = "", clock: Clock = REAL_CLOCK) -> None:
        self.clock = clock
        self.cache = cache
        self.config = config
        self.run_id = run_id  # the manager's run: prefix context ids never repeat across restarts
        self._fills: dict[int, asyncio.Task[None]] = {}  # id(entry) -> its fill in flight
        self._frees: set[asyncio.Task[None]] = set()
        self._ids = itertools.count()

    async def lease(
        self,
        engine: EngineHandle,
        call: CallNode,
        token_ids: list[int],
        points: tuple[PrefixPoint, ...],
        early: bool,
        objective: Objective,
        priority: int,
        owner: str = "",
    ) -> Lease | None:
        """Lease the longest cached prefix of `points` on `engine`, first creating the cache points
        the policy picks (filled with the call's `objective` and `priority`); None when there is
        nothing to fork from."""
        hit = self.cache.longest(engine.engine_id, points)
        hit_tokens = hit.num_tokens if hit is not None else 0
        include_deepest = early or (
            call.message_boundaries is not None and not any(p.kind is PointKind.MESSAGE for p in points)
        )
        parent = hit
        for point in choose_cache_points(
            points,
            hit_tokens=hit_tokens,
            num_sharers=self.cache.num_sharers,
            min_tokens=self.config.sharing.min_prefix_tokens,
            include_deepest=include_deepest,
        ):
            existing = self.cache.get(engine.engine_id, point.prefix_hash)
            parent = existing or self._create(engine, parent, point, token_ids, objective, priority, owner, early)
        if parent is None:
            return None
        self.cache.acquire(parent, self.clock.now())
        try:
            await self._ready(parent)
        except BaseException:
            self.cache.release(parent, self.clock.now())
            raise
        if hit is not None:
            hit.num_hits += 1
        return Lease(parent, hit_tokens)

    def release(self, lease: Lease) -> None:
        self.cache.release(lease.entry, self.clock.now())

    def _create(
        self,
        engine: EngineHandle,
        parent: PrefixEntry | None,
        point: PrefixPoint,
        token_ids: list[int],
        objective: Objective,
        priority: int,
        owner: str = "",
        early: bool = False,
    ) -> PrefixEntry:
        context_id = f"pfx-{self.run_id}-{next(self._ids)}-{point.prefix_hash[:12]}"
        entry = PrefixEntry(point.prefix_hash, engine.engine_id, context_id, point.num_tokens, parent)
        entry.created_for, entry.created_early = owner, early
        entry.last_used = self.clock.now()
        self.cache.add(entry)
        if parent is not None:
            self.cache.acquire(parent, entry.last_used)  # until the fork has read it
        start = parent.num_tokens if parent is not None else 0
        request = ExtendRequest(
            context_id=context_id,
            token_ids=token_ids[start : point.num_tokens],
            parent_context_id=None if parent is None else parent.context_id,
            objective=objective,
            priority=priority,
        )
        task = asyncio.get_running_loop().create_task(self._fill(engine, entry, request))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # waiters see the error
        self._fills[id(entry)] = task
        return entry

    async def _fill(self, engine: EngineHandle, entry: PrefixEntry, request: ExtendRequest) -> None:
        try:
            if entry.parent is not None:
                await self._ready(entry.parent)
            await extend_only(engine.client, request)
            entry.state = EntryState.READY
        except BaseException:
            if self.cache.remove(entry):
                self._free(engine, entry)
            raise
        finally:
            if entry.parent is not None:
                self.cache.release(entry.parent, self.clock.now())
            self._fills.pop(id(entry), None)

    async def _ready(self, entry: PrefixEntry) -> None:
        task = self._fills.get(id(entry))
        if task is not None:
            await asyncio.shield(task)  # a cancelled waiter leaves the shared fill running
        elif entry.state is not EntryState.READY:
            raise EngineUnavailable(f"cached prefix {entry.context_id} was lost with its engine")

    # --- eviction -------------------------------------------------------------------------------

    def relieve(self, engine: EngineHandle) -> list[PrefixEntry]:
        """Evict idle cached prefixes while the engine's free KV blocks are low (its last stats)."""
        s = engine.stats
        memory = MemoryView(s.num_blocks_total, s.num_blocks_free, s.block_size)
        victims = plan_evictions(
            self.cache.entries(engine.engine_id),
            memory,
            self.config.sharing.prefix_evict_below_free,
            self.config.sharing.prefix_evict_to_free,
        )
        for entry in victims:
            self.cache.remove(entry)
            self._free(engine, entry)
        return victims

    def drop_engine(self, engine_id: str) -> None:
        """A dead engine: forget its prefixes and stop their fills."""
        for entry in self.cache.drop_engine(engine_id):
            task = self._fills.get(id(entry))
            if task is not None:
                task.cancel()

    async def clear(self, engines: Mapping[str, EngineHandle]) -> None:
        """Free every cached prefix context not in use (the manager stops; tests)."""
        for entry in sorted(self.cache.entries(), key=lambda e: -e.num_tokens):
            if entry.num_users == 0 and id(entry) not in self._fills and self.cache.remove(entry):
                self._free(engines[entry.engine_id], entry)
        await asyncio.gather(*self._frees, return_exceptions=True)

    def _free(self, engine: EngineHandle, entry: PrefixEntry) -> None:
        if not engine.alive:
            return
        task = asyncio.get_running_loop().create_task(free_engine_context(engine.client, entry.context_id))
        self._frees.add(task)
        task.add_done_callback(self._frees.discard)
