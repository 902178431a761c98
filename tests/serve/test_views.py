"""The policy's views of waiting calls: prefix hits refreshed only where the index changed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from parrot.serve.config import ManagerConfig
from parrot.serve.policy.plan import CallView
from parrot.serve.policy.prefix import PointKind, PrefixPoint
from parrot.serve.runtime.call_run import CallRun
from parrot.serve.runtime.prefix_cache import EntryState, PrefixCache, PrefixEntry
from parrot.serve.runtime.views import CallViews


def entry(n: int, engine_id: str) -> PrefixEntry:
    return PrefixEntry(f"h{n}", engine_id, f"pfx-{engine_id}-{n}", n, None, state=EntryState.READY)


def waiting(call_id: str, points: tuple[PrefixPoint, ...]) -> CallRun:
    run = CallRun(call=SimpleNamespace(call_id=call_id), order=0)  # type: ignore[arg-type]
    run.view = CallView(("s", call_id), "m", 0, True, None, 1, 0, None)
    run.prefix_points = points
    run.prefix_hashes = frozenset(p.prefix_hash for p in points)
    run.hits_stale = True
    return run


def test_hits_follow_the_index_and_only_changed_prefixes_are_looked_up_again() -> None:
    cache = PrefixCache()
    pool: Any = SimpleNamespace(handles={e: SimpleNamespace(model="m") for e in ("e0", "e1")})
    views = CallViews(pool, ManagerConfig(), cache)
    lookups: list[tuple[str, ...]] = []
    real = cache.hits_over_floor

    def counted(points: Any, num_engines: int) -> Any:
        lookups.append(tuple(p.prefix_hash for p in points))
        return real(points, num_engines)

    cache.hits_over_floor = counted  # type: ignore[method-assign]
    system, question = PrefixPoint(40, "h40", PointKind.VARIABLE), PrefixPoint(90, "h90", PointKind.VARIABLE)
    a, b = waiting("a", (system, question)), waiting("b", (system,))
    other = waiting("c", (PrefixPoint(64, "h64", PointKind.VARIABLE),))
    cache.add(entry(40, "e0"))

    def hits() -> dict[str, tuple[tuple[tuple[str, int], ...], int]]:
        return {v.key[1]: (v.prefix_hits, v.prefix_floor) for v in views.current([a, b, other])}

    assert hits() == {"a": ((("e0", 40),), 0), "b": ((("e0", 40),), 0), "c": ((), 0)}
    assert len(lookups) == 3  # each new view once
    lookups.clear()
    assert hits()["a"] == ((("e0", 40),), 0)
    assert lookups == []  # nothing changed: nothing looked up
    cache.add(entry(40, "e1"))  # now every engine holds the system prompt: the floor
    cache.add(entry(90, "e1"))
    assert hits() == {"a": ((("e1", 90),), 40), "b": ((), 40), "c": ((), 0)}
    assert sorted(lookups) == [("h40",), ("h40", "h90")]  # c shares no changed prefix
    lookups.clear()
    pool.handles["e2"] = SimpleNamespace(model="m")  # a new engine holds nothing: no floor
    assert hits()["b"] == ((("e0", 40), ("e1", 40)), 0)
    assert len(lookups) == 3  # the floor's meaning changed: every view again
