"""The cluster prefix index and eviction planning: exact outcomes on hand-built entries."""

from __future__ import annotations

import pytest

from parrot.serve.policy.prefix import PointKind, PrefixPoint
from parrot.serve.runtime.prefix_cache import EntryState, MemoryView, PrefixCache, PrefixEntry, plan_evictions


def point(n: int) -> PrefixPoint:
    return PrefixPoint(n, f"h{n}", PointKind.VARIABLE)


def entry(n: int, engine_id: str, parent: PrefixEntry | None = None, **kw: object) -> PrefixEntry:
    e = PrefixEntry(f"h{n}", engine_id, f"pfx-{engine_id}-{n}", n, parent, state=EntryState.READY)
    for k, v in kw.items():
        setattr(e, k, v)
    return e


def test_index_lookups_per_engine() -> None:
    cache = PrefixCache()
    root0 = entry(40, "e0")
    child0 = entry(90, "e0", root0)
    root1 = entry(40, "e1")
    for e in (root0, child0, root1):
        cache.add(e)
    points = (point(40), point(60), point(90), point(120))
    assert cache.longest("e0", points) is child0
    assert cache.longest("e1", points) is root1
    assert cache.longest("e2", points) is None
    assert cache.hits(points) == {"e0": 90, "e1": 40}
    assert cache.hits((point(60),)) == {}
    assert root0.num_children == 1
    with pytest.raises(KeyError):
        cache.add(entry(40, "e0"))
    # Removing a child makes its parent a leaf again; removing twice is a no-op.
    assert cache.remove(child0)
    assert not cache.remove(child0)
    assert root0.num_children == 0
    assert cache.hits(points) == {"e0": 40, "e1": 40}
    # A dead engine's entries all go.
    assert cache.drop_engine("e0") == [root0]
    assert cache.hits(points) == {"e1": 40}
    assert cache.entries() == [root1]


def test_refcounts_and_calls_seen() -> None:
    cache = PrefixCache(max_seen=3)
    e = entry(40, "e0")
    cache.acquire(e, now=1.0)
    cache.acquire(e, now=2.0)
    cache.release(e, now=3.0)
    assert [e.num_users, e.last_used] == [1, 3.0]
    cache.release(e, now=4.0)
    with pytest.raises(AssertionError):
        cache.release(e, now=5.0)

    cache.note_call(("s", "c0"), [point(40), point(60)])
    cache.note_call(("s", "c0"), [point(40), point(60)])  # the same call again counts once
    assert [cache.num_sharers("h40"), cache.num_sharers("h60")] == [1, 1]
    cache.note_call(("t", "c0"), [point(40)])
    cache.note_call(("u", "c0"), [point(40)])  # counted up to 2
    assert cache.num_sharers("h40") == 2
    cache.note_call(("u", "c1"), [point(7), point(8)])  # the least recently noted hash goes
    assert [cache.num_sharers("h60"), cache.num_sharers("h40"), cache.num_sharers("h8")] == [0, 2, 1]


def test_evictions_take_idle_leaves_least_recently_used_first() -> None:
    # bs 16. root (48 tokens) <- a (100 tokens, idle, older) ; root <- b (80 tokens, in use)
    # other root2 (33 tokens, idle, oldest) ; filling entries are never taken.
    root = entry(48, "e0", last_used=5.0)
    a = entry(100, "e0", root, last_used=2.0)
    b = entry(80, "e0", root, last_used=1.0, num_users=1)
    root.num_children = 2
    root2 = entry(33, "e0", last_used=1.5)
    filling = entry(200, "e0", last_used=0.0, state=EntryState.FILLING)
    entries = [root, a, b, root2, filling]
    memory = MemoryView(num_blocks_total=100, num_blocks_free=5, block_size=16)
    # Below 10% free: evict until 20% free (15 blocks). root2 frees 3 blocks, a frees 7 - 2 = 5,
    # then root is not a leaf (b still uses it) and b is in use: 8 blocks is all there is.
    assert plan_evictions(entries, memory, 0.1, 0.2) == [root2, a]
    assert plan_evictions(entries, MemoryView(100, 10, 16), 0.1, 0.2) == []
    # Enough after the first victim.
    assert plan_evictions(entries, MemoryView(100, 9, 16), 0.1, 0.12) == [root2]
    # With b idle too, root becomes a leaf once both children go.
    b.num_users = 0
    assert plan_evictions(entries, MemoryView(100, 0, 16), 0.1, 0.5) == [b, root2, a, root]


def test_hits_over_floor_leave_out_what_every_engine_holds() -> None:
    cache = PrefixCache()
    system = {e: entry(40, e) for e in ("e0", "e1", "e2")}  # a system prompt cached everywhere
    for e in system.values():
        cache.add(e)
    cache.add(entry(90, "e1", system["e1"]))
    points = (point(40), point(60), point(90))
    assert cache.hits_over_floor(points, num_engines=3) == ({"e1": 90}, 40)
    assert cache.hits(points) == {"e0": 40, "e1": 90, "e2": 40}  # the full map, for comparison
    # A fourth engine that holds nothing: no point is held by all, every holder is listed.
    assert cache.hits_over_floor(points, num_engines=4) == ({"e0": 40, "e1": 90, "e2": 40}, 0)
    # Held everywhere at its deepest point too: the floor is that point, nothing is listed.
    for e in ("e0", "e2"):
        cache.add(entry(90, e, system[e]))
    assert cache.hits_over_floor(points, num_engines=3) == ({}, 90)
    assert cache.hits_over_floor((point(60),), num_engines=3) == ({}, 0)


def test_changed_hashes_are_reported_once() -> None:
    cache = PrefixCache()
    root = entry(40, "e0")
    child = entry(90, "e0", root)
    cache.add(root)
    cache.add(child)
    cache.acquire(child, 1.0)  # use counts do not change where a prefix is held
    assert cache.take_changed() == {"h40", "h90"}
    assert cache.take_changed() == set()
    cache.remove(child)
    assert cache.take_changed() == {"h90"}
    cache.add(entry(40, "e1"))
    cache.drop_engine("e0")
    assert cache.take_changed() == {"h40"}
