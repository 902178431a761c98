"""The cluster's prefix index: prefix hash -> the engine contexts that hold that prefix.

Owned by the manager (mutated only on its event loop); `PrefixContexts` (contexts.py) is its only
writer of entries, the executor reads it to build scheduling snapshots. No I/O here: eviction is
planned by the pure `plan_evictions` and applied by `PrefixContexts`.

An entry is one engine context holding exactly the tokens of its prefix. It stays valid until it
is evicted or its engine dies; `num_users` counts the calls (and child entries being filled) that
will fork from it, and an entry with users is never evicted. Entries form trees per engine (an
entry is filled as a fork of a shorter cached prefix); eviction takes leaves first, least recently
used first, so a shared root outlives the branches built on it.

The index also remembers which prefix hashes recent calls had (`note_call`), so a prefix that two
known calls share is worth caching before either runs (prefix.choose_cache_points).
"""

from __future__ import annotations

import math
import sys
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from parrot.serve.policy.prefix import PrefixPoint

CallKey = tuple[str, str]


class EntryState(StrEnum):
    FILLING = "filling"  # its fill is in flight; forks wait for it
    READY = "ready"


@dataclass(eq=False)
class PrefixEntry:
    prefix_hash: str
    engine_id: str
    context_id: str
    num_tokens: int
    parent: PrefixEntry | None  # the cached prefix it was forked from, on the same engine
    state: EntryState = EntryState.FILLING
    num_users: int = 0
    num_children: int = 0  # cached entries forked from this one
    last_used: float = 0.0
    num_hits: int = 0  # forks by calls that found it cached
    # Accounting: the call (its context id) whose fill created it, and whether that call was still
    # waiting then (an early fill); its computed tokens belong to that call.
    created_for: str = ""
    created_early: bool = False

    @property
    def num_computed_tokens(self) -> int:
        """Tokens its fill computed: the parent's last one and all of its own but its last."""
        return self.num_tokens - (self.parent.num_tokens if self.parent is not None else 1)


class PrefixCache:
    def __init__(self, max_seen: int = 100_000) -> None:
        self._entries: dict[str, dict[str, PrefixEntry]] = {}  # hash -> engine_id -> entry
        self._by_engine: dict[str, dict[str, PrefixEntry]] = {}  # engine_id -> hash -> entry
        self._seen: OrderedDict[str, tuple[CallKey, ...]] = OrderedDict()  # hash -> up to 2 calls
        self._max_seen = max_seen
        self._changed: set[str] = set()  # hashes whose engines changed since `take_changed`

    # --- lookups --------------------------------------------------------------------------------

    def get(self, engine_id: str, prefix_hash: str) -> PrefixEntry | None:
        return self._by_engine.get(engine_id, {}).get(prefix_hash)

    def longest(self, engine_id: str, points: Sequence[PrefixPoint]) -> PrefixEntry | None:
        """The entry on `engine_id` for the longest of `points` it holds."""
        held = self._by_engine.get(engine_id, {})
        for point in reversed(points):
            entry = held.get(point.prefix_hash)
            if entry is not None:
                return entry
        return None

    def hits(self, points: Sequence[PrefixPoint]) -> dict[str, int]:
        """engine_id -> the longest of `points` (in tokens) that engine holds (no floor)."""
        return self.hits_over_floor(points, sys.maxsize)[0]

    def hits_over_floor(self, points: Sequence[PrefixPoint], num_engines: int) -> tuple[dict[str, int], int]:
        """(`hits` without the engines whose longest is the floor, the floor): the floor is the
        longest of `points` that all `num_engines` engines of the model hold (0: none is held by
        all). Cheap where every engine holds a shared system prompt: the points are read from the
        longest down, and the engines that hold only the floor are not listed (they all hold it,
        so it says nothing about where the call should run)."""
        out: dict[str, int] = {}
        for point in reversed(points):
            holders = self._entries.get(point.prefix_hash)
            if not holders:
                continue
            if len(holders) >= num_engines:
                return out, point.num_tokens
            for engine_id in holders:
                out.setdefault(engine_id, point.num_tokens)  # points descend: the first one wins
        return out, 0

    def take_changed(self) -> set[str]:
        """The prefix hashes whose set of holding engines changed since the last call (an entry
        added or removed): only calls with one of them have new `hits`."""
        changed, self._changed = self._changed, set()
        return changed

    def entries(self, engine_id: str | None = None) -> list[PrefixEntry]:
        if engine_id is not None:
            return list(self._by_engine.get(engine_id, {}).values())
        return [e for per_engine in self._by_engine.values() for e in per_engine.values()]

    # --- entries --------------------------------------------------------------------------------

    def add(self, entry: PrefixEntry) -> None:
        if self.get(entry.engine_id, entry.prefix_hash) is not None:
            raise KeyError(f"prefix {entry.prefix_hash} is cached on {entry.engine_id} already")
        self._entries.setdefault(entry.prefix_hash, {})[entry.engine_id] = entry
        self._by_engine.setdefault(entry.engine_id, {})[entry.prefix_hash] = entry
        self._changed.add(entry.prefix_hash)
        if entry.parent is not None:
            entry.parent.num_children += 1

    def remove(self, entry: PrefixEntry) -> bool:
        """Drop the entry from the index (its context is freed by the caller); False if gone."""
        if self.get(entry.engine_id, entry.prefix_hash) is not entry:
            return False
        del self._entries[entry.prefix_hash][entry.engine_id]
        if not self._entries[entry.prefix_hash]:
            del self._entries[entry.prefix_hash]
        del self._by_engine[entry.engine_id][entry.prefix_hash]
        self._changed.add(entry.prefix_hash)
        if entry.parent is not None:
            entry.parent.num_children -= 1
        return True

    def drop_engine(self, engine_id: str) -> list[PrefixEntry]:
        """Forget every entry of a dead engine; returns them."""
        dropped = list(self._by_engine.pop(engine_id, {}).values())
        for entry in dropped:
            self._changed.add(entry.prefix_hash)
            per_hash = self._entries.get(entry.prefix_hash, {})
            per_hash.pop(engine_id, None)
            if not per_hash:
                self._entries.pop(entry.prefix_hash, None)
        return dropped

    @staticmethod
    def acquire(entry: PrefixEntry, now: float) -> None:
        entry.num_users += 1
        entry.last_used = now

    @staticmethod
    def release(entry: PrefixEntry, now: float) -> None:
        assert entry.num_users > 0, "released more often than acquired"
        entry.num_users -= 1
        entry.last_used = now

    # --- calls seen -----------------------------------------------------------------------------

    def note_call(self, key: CallKey, points: Iterable[PrefixPoint]) -> None:
        """Remember that call `key` has these prefixes (counted once per call, up to 2 calls)."""
        for point in points:
            calls = self._seen.pop(point.prefix_hash, ())
            if key not in calls and len(calls) < 2:
                calls = (*calls, key)
            self._seen[point.prefix_hash] = calls
        while len(self._seen) > self._max_seen:
            self._seen.popitem(last=False)

    def num_sharers(self, prefix_hash: str) -> int:
        """How many known calls (counted up to 2) have this prefix."""
        return len(self._seen.get(prefix_hash, ()))


@dataclass(frozen=True)
class MemoryView:
    """What an engine reports about its KV pool (from EngineStats)."""

    num_blocks_total: int
    num_blocks_free: int
    block_size: int


def plan_evictions(
    entries: Sequence[PrefixEntry], memory: MemoryView, low_free_fraction: float, target_free_fraction: float
) -> list[PrefixEntry]:
    """Idle cached prefixes of one engine to evict, in order, so its free KV blocks get back to
    `target_free_fraction` once they fell below `low_free_fraction`.

    Only entries with no users and no cached children are taken (leaves, least recently used
    first); evicting a leaf may make its parent a leaf. An entry is estimated to free the blocks
    past its parent's (the rest it shares with the parent).
    """
    total = memory.num_blocks_total
    if total <= 0 or memory.num_blocks_free >= low_free_fraction * total:
        return []
    need = math.ceil(target_free_fraction * total) - memory.num_blocks_free
    children = {id(e): e.num_children for e in entries}
    idle_leaves = [e for e in entries if e.num_users == 0 and e.num_children == 0 and e.state is EntryState.READY]
    out: list[PrefixEntry] = []
    freed = 0
    while freed < need and idle_leaves:
        idle_leaves.sort(key=lambda e: (e.last_used, e.context_id))
        victim = idle_leaves.pop(0)
        out.append(victim)
        bs = memory.block_size
        parent = victim.parent
        parent_blocks = (parent.num_tokens - 1) // bs if parent is not None else 0
        freed += max(1, math.ceil(victim.num_tokens / bs) - parent_blocks)
        if parent is not None and id(parent) in children:
            children[id(parent)] -= 1
            if children[id(parent)] == 0 and parent.num_users == 0 and parent.state is EntryState.READY:
                idle_leaves.append(parent)
    return out
