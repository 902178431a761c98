"""The app-centric scheduling policy (the paper's §5, Algorithm 1): a pure function of a snapshot.

Ready calls are taken in rank order, the calls of the tenant with fewer running calls first (fair
share between tenants; with one tenant, no effect), then:
  1. calls that have waited `aging_s` (no starvation behind latency-critical or cache-hot work);
  2. latency-critical calls, then higher priority (a group whose consumer a person awaits);
  3. calls with a longer cached prefix on some engine (cache-hot first);
  4. submission order.
Any order of ready calls is topological: a ready call's producers have finished.

Placement among the engines of the call's model that are alive and have room prefers, in order:
the engine holding the call's longest cached prefix, the engine already running its task group,
the engine running its application, the least loaded. A task group is placed on one engine when
all its ready members fit there. Room follows the objectives an engine hosts (capacity.py):
while it runs latency-critical work it takes at most its calibrated latency cap of calls; with
throughput work alone, its plain limit; a latency-critical call counts only the latency-critical
calls against that cap (throughput calls running already never hold it back, and no new one
starts past the cap while it runs). A ready call that fits nowhere reserves the engine that
will have room first, so later-ranked work cannot take that engine's freed slots forever.
Early fills (pipelining) go to the engine the call will most likely run on.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from parrot.protocol.objective import Objective
from parrot.serve.policy.capacity import call_capacity
from parrot.serve.policy.plan import CallKey, CallView, Dispatch, EarlyFill, EngineView, FailCall, Plan, Snapshot


@dataclass
class _Load:
    """What the plan has put on the engines so far (starts from the snapshot)."""

    running: dict[str, int]
    latency: dict[str, int]
    early: dict[str, int]
    snapshot_groups: Mapping[str, tuple[str, ...]]  # the snapshot's, read only
    snapshot_apps: Mapping[str, tuple[str, ...]]
    groups: dict[str, set[str]] = field(default_factory=dict)  # what this plan placed
    apps: dict[str, set[str]] = field(default_factory=dict)
    reserved: set[str] = field(default_factory=set)
    # model -> heap of (running calls, engine id), stale entries skipped: the least-loaded engine
    # without a scan of every engine; and the call signatures no engine has room for (room only
    # shrinks within a plan: loads grow, reservations are kept).
    least: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    full: set[tuple[str, bool, str, int]] = field(default_factory=set)
    tenants: dict[str, dict[str, int]] = field(default_factory=dict)  # engine -> tenant -> running
    num_tenants: int = 1  # tenants with work (running or ready calls)

    def place(self, call: CallView, engine_id: str) -> None:
        self.running[engine_id] += 1
        heapq.heappush(self.least.setdefault(call.model, []), (self.running[engine_id], engine_id))
        on_engine = self.tenants.setdefault(engine_id, {})
        on_engine[call.tenant] = on_engine.get(call.tenant, 0) + 1
        if call.objective is Objective.LATENCY:
            self.latency[engine_id] += 1
        if call.task_group is not None:
            self.groups.setdefault(call.task_group, set()).add(engine_id)
        self.apps.setdefault(call.key[0], set()).add(engine_id)

    def group_at(self, group: str | None) -> set[str]:
        """Engines running the task group's calls, the snapshot's and this plan's (no copy of
        every group per plan: a plan costs the calls it looks at, not every running group)."""
        if group is None:
            return set()
        return {*self.snapshot_groups.get(group, ()), *self.groups.get(group, ())}

    def app_at(self, app: str) -> set[str]:
        return {*self.snapshot_apps.get(app, ()), *self.apps.get(app, ())}


class AppCentricPolicy:
    def plan(self, snapshot: Snapshot) -> Plan:
        engines = {e.engine_id: e for e in snapshot.engines}
        load = _Load(
            running={e.engine_id: e.num_running_calls for e in snapshot.engines},
            latency={e.engine_id: e.num_latency_calls for e in snapshot.engines},
            early={e.engine_id: e.num_early_filled_calls for e in snapshot.engines},
            snapshot_groups=snapshot.group_engines,
            snapshot_apps=snapshot.app_engines,
            tenants={e: dict(ts) for e, ts in snapshot.tenant_running.items()},
        )
        fail = [FailCall(c.key, c.failed_var_id) for c in snapshot.calls if c.failed_var_id is not None]
        ready = [c for c in snapshot.calls if c.failed_var_id is None and c.inputs_ready]
        for e in snapshot.engines:
            if e.alive:
                load.least.setdefault(e.model, []).append((e.num_running_calls, e.engine_id))
        for heap in load.least.values():
            heapq.heapify(heap)
        by_group: dict[str, list[CallView]] = {}
        for c in ready:
            if c.task_group is not None:
                by_group.setdefault(c.task_group, []).append(c)
        tenant_load: dict[str, int] = {}
        for on_engine in snapshot.tenant_running.values():
            for tenant, n in on_engine.items():
                tenant_load[tenant] = tenant_load.get(tenant, 0) + n
        load.num_tenants = len(set(tenant_load) | {c.tenant for c in ready})
        ready.sort(key=lambda c: _rank(c, snapshot, tenant_load.get(c.tenant, 0)))
        dispatch: list[Dispatch] = []
        blocked: list[CallKey] = []
        placed: set[CallKey] = set()
        for call in ready:
            if call.key in placed:
                continue
            group = _group_members(call, by_group.get(call.task_group or "", []), placed)
            if len(group) > 1:
                engine_id = _best(group[0], engines, load, num_calls=len(group), objectives=group)
                if engine_id is not None:
                    for member in group:
                        dispatch.append(_place(member, engines[engine_id], load))
                        placed.add(member.key)
                    continue
            engine_id = _best(call, engines, load)
            if engine_id is None:
                blocked.append(call.key)
                _reserve(call, engines, load)
                continue
            dispatch.append(_place(call, engines[engine_id], load))
            placed.add(call.key)
        early_fill = _early_fills(snapshot, engines, load) if snapshot.early_fill else []
        return Plan(tuple(fail), tuple(early_fill), tuple(dispatch), tuple(blocked))


def _rank(call: CallView, snapshot: Snapshot, tenant_load: int) -> tuple[int, int, int, int, int, int]:
    """The tenant with fewer running calls first (fair share: aging within a flood does not put
    it ahead of another tenant; one tenant: no effect), then aged, latency-critical, priority,
    cache hotness, submission order."""
    aged = snapshot.aging_s > 0 and snapshot.now - call.ready_since >= snapshot.aging_s
    best_hit = max((n for _, n in call.prefix_hits), default=call.prefix_floor)
    latency = call.objective is Objective.LATENCY
    return (tenant_load, 0 if aged else 1, 0 if latency else 1, -call.priority, -best_hit, call.order)


def _group_members(call: CallView, members: list[CallView], placed: set[CallKey]) -> list[CallView]:
    """The ready calls of `call`'s task group not placed yet (`members`: the group's ready calls)."""
    if call.task_group is None or call.pinned:
        return [call]
    return [c for c in members if c.key not in placed and not c.pinned]


def _candidates(call: CallView, engines: dict[str, EngineView]) -> list[EngineView]:
    if call.pinned:
        e = engines.get(call.engine_id or "")
        return [e] if e is not None and e.alive else []
    return [e for e in engines.values() if e.model == call.model and e.alive]


def _cap(e: EngineView, load: _Load, any_latency: bool) -> int:
    return call_capacity(load.latency[e.engine_id], e.latency_cap, e.max_running_calls, any_latency)


def _share(cap: int, load: _Load) -> int:
    """Each tenant's share of an engine's `cap` calls (at least one) while several tenants have work."""
    return max(1, cap // load.num_tenants)


def _fits(e: EngineView, load: _Load, num_calls: int, any_latency: bool, tenant: str) -> bool:
    cap = _cap(e, load, any_latency)
    # Latency-critical work counts against the cap with the engine's other latency-critical work
    # only: throughput calls it already runs (placed while it hosted none) never hold it back, as
    # waiting would not shrink their batch, only delay the call the engine would run first.
    occupied = load.latency[e.engine_id] if any_latency else load.running[e.engine_id]
    if occupied + num_calls <= cap and load.running[e.engine_id] + num_calls <= e.max_running_calls:
        return True
    # With several tenants, each may run its share of the cap whatever the others run: another
    # tenant's flood, even one dispatched before the cap was calibrated down, does not keep it
    # waiting. The engine then holds at most its cap plus one call per tenant.
    on_engine = load.tenants.get(e.engine_id, {}).get(tenant, 0)
    return load.num_tenants > 1 and on_engine + num_calls <= _share(cap, load)


def _place(call: CallView, e: EngineView, load: _Load) -> Dispatch:
    """Put `call` on `e`: its dispatch, marked `fair_share` when its tenant is under its share of
    the engine while another tenant is over its own (the mark stays with the call: a passing
    overlap of two tenants marks nothing)."""
    fair_share = False
    if load.num_tenants > 1:
        share = _share(_cap(e, load, call.objective is Objective.LATENCY), load)
        tenants = load.tenants.get(e.engine_id, {})
        crowded = any(n > share for t, n in tenants.items() if t != call.tenant)
        fair_share = crowded and tenants.get(call.tenant, 0) < share
    load.place(call, e.engine_id)
    return Dispatch(call.key, e.engine_id, fair_share)


def _best(
    call: CallView,
    engines: dict[str, EngineView],
    load: _Load,
    num_calls: int = 1,
    objectives: list[CallView] | None = None,
) -> str | None:
    """The preferred engine with room for `num_calls` calls like `call` (or the group's calls):
    the most prefix hits, then its task group's, its app's, its own engine, then the least loaded.

    Only the few engines with an affinity are looked at one by one; any of them with room beats
    every other engine, and among the others the least loaded comes from a heap, so a decision
    does not scan every engine."""
    any_latency = any(c.objective is Objective.LATENCY for c in (objectives or [call]))
    if call.pinned:
        fitting = [e for e in _candidates(call, engines) if _room(e, load, num_calls, any_latency, call.tenant)]
        return fitting[0].engine_id if fitting else None
    signature = (call.model, any_latency, call.tenant if load.num_tenants > 1 else "", num_calls)
    if signature in load.full:
        return None
    hits = dict(call.prefix_hits)
    group_at = load.group_at(call.task_group)
    app_at = load.app_at(call.key[0])
    near = hits.keys() | group_at | app_at | ({call.engine_id} if call.engine_id else set())
    fitting = [
        e
        for e in (engines.get(i) for i in near)
        if e is not None and e.model == call.model and e.alive and _room(e, load, num_calls, any_latency, call.tenant)
    ]
    if fitting:
        return _preferred(
            fitting, hits, group_at, app_at, lambda e: (e.engine_id != call.engine_id, load.running[e.engine_id])
        )
    heap = load.least.get(call.model, [])
    skipped = []
    best = None
    while heap:
        running, engine_id = heapq.heappop(heap)
        if running != load.running[engine_id] or engine_id in load.reserved:
            continue  # stale (a newer entry holds its load) or held back for good in this plan
        skipped.append((running, engine_id))
        if engine_id not in near and _fits(engines[engine_id], load, num_calls, any_latency, call.tenant):
            best = engine_id
            break
    for entry in skipped:
        heapq.heappush(heap, entry)
    if best is None:
        load.full.add(signature)
    return best


def _preferred(
    fitting: list[EngineView],
    hits: dict[str, int],
    group_at: set[str],
    app_at: set[str],
    then: Callable[[EngineView], tuple[object, ...]],
) -> str:
    """The engine of `fitting` holding the most of the call's prefix, then running its task group,
    then its application, then by `then`, then by id."""
    return min(
        fitting,
        key=lambda e: (
            -hits.get(e.engine_id, 0),
            e.engine_id not in group_at,
            e.engine_id not in app_at,
            *then(e),
            e.engine_id,
        ),
    ).engine_id


def _room(e: EngineView, load: _Load, num_calls: int, any_latency: bool, tenant: str) -> bool:
    return e.engine_id not in load.reserved and _fits(e, load, num_calls, any_latency, tenant)


def _reserve(call: CallView, engines: dict[str, EngineView], load: _Load) -> None:
    """Hold back the candidate engine that will have room first for a call that fits nowhere."""
    if call.pinned:
        free = [e for e in _candidates(call, engines) if e.engine_id not in load.reserved]
        if free:
            load.reserved.add(free[0].engine_id)
        return
    heap = load.least.get(call.model, [])
    while heap:
        running, engine_id = heap[0]
        if running != load.running[engine_id] or engine_id in load.reserved:
            heapq.heappop(heap)
            continue
        load.reserved.add(engine_id)
        return


def _early_fills(snapshot: Snapshot, engines: dict[str, EngineView], load: _Load) -> list[EarlyFill]:
    out: list[EarlyFill] = []
    spare: dict[str, list[tuple[int, str]]] = {}  # model -> heap of (early fills, engine id), stale skipped
    for call in sorted(snapshot.calls, key=lambda c: c.order):
        if call.failed_var_id is not None or call.inputs_ready or call.num_ready_pieces <= call.num_filled_pieces:
            continue
        engine_id = call.engine_id
        if engine_id is None or not engines[engine_id].alive:
            engine_id = _early_engine(call, engines, load, spare)
            if engine_id is None:
                continue
            load.early[engine_id] += 1
            load.apps.setdefault(call.key[0], set()).add(engine_id)
        out.append(EarlyFill(call.key, engine_id, call.num_ready_pieces))
    return out


def _early_engine(
    call: CallView, engines: dict[str, EngineView], load: _Load, spare: dict[str, list[tuple[int, str]]]
) -> str | None:
    """Where a waiting call's early fill goes: among the live engines of its model with early-fill
    room, the one holding its longest cached prefix, then its task group's, its app's, then the
    fewest early fills. As in `_best`, only the few engines with an affinity are looked at one by
    one (any of them beats every other); the rest come from a heap, so 10k waiting calls do not
    each scan every engine."""
    if call.pinned:  # its context is on a dead engine: nowhere to fill early
        return None

    def has_room(e: EngineView) -> bool:
        return e.model == call.model and e.alive and load.early[e.engine_id] < e.max_early_filled_calls

    hits = dict(call.prefix_hits)
    group_at = load.group_at(call.task_group)
    app_at = load.app_at(call.key[0])
    near = {i for i, n in hits.items() if n > 0} | group_at | app_at
    fitting = [e for i in near if (e := engines.get(i)) is not None and has_room(e)]
    if fitting:
        return _preferred(fitting, hits, group_at, app_at, lambda e: (load.early[e.engine_id],))
    heap = spare.get(call.model)
    if heap is None:
        heap = [(load.early[e.engine_id], e.engine_id) for e in engines.values() if e.model == call.model and e.alive]
        heapq.heapify(heap)
        spare[call.model] = heap
    while heap:
        early, engine_id = heap[0]
        if early != load.early[engine_id]:  # filled since it was pushed: again with its count now
            heapq.heapreplace(heap, (load.early[engine_id], engine_id))
            continue
        if early >= engines[engine_id].max_early_filled_calls:
            heapq.heappop(heap)  # full: counts only grow within a plan
            continue
        return engine_id
    return None
