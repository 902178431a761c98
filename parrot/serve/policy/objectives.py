"""Performance-objective deduction: from the criteria of `get`s backwards through a session's DAG.

A pure function of the DAG and the criteria its gets asked for; the executor re-runs it for a
session whenever new calls or new gets arrive (parrot/serve/runtime/deduction.py applies it to the
session's graph; session status shows it; the scheduler and the engine requests read it).

Rules (calls visited in reverse topological order, so every consumer is decided before its
producers):
- a call's *urgency* is the strongest criteria of what waits on it: a `get` of one of its outputs,
  or the urgency of a consumer (latency beats throughput; None while nobody asked);
- a consumer with two or more producer calls makes them a *task group* (the parallel stage that
  feeds it, e.g. the maps of a map-reduce): they are batched for throughput, since only the
  group's completion time matters, and share the consumer's urgency as their priority;
- a call whose output a person awaits (latency get), or that is the only producer of a
  latency-urgent consumer (a chain, a split before a group), is latency-critical;
- otherwise a call with an urgency takes it as its objective, a task-group member is throughput,
  and a call nobody asked for yet gets the configured default.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from parrot.protocol.objective import Criteria, Objective


@dataclass(frozen=True, slots=True)
class DagCall:
    call_id: str
    input_var_ids: tuple[str, ...]
    output_var_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Deduction:
    objective: Objective
    urgency: Criteria | None  # what waits at the end of its paths (None: nobody asked yet)
    task_group: str | None  # call id of the consumer its group feeds
    priority: int  # for the engine's scheduler: 1 when a person waits at the end, else 0


def _stronger(a: Criteria | None, b: Criteria | None) -> Criteria | None:
    if a is Criteria.LATENCY or b is Criteria.LATENCY:
        return Criteria.LATENCY
    return a or b


def _rank(c: Criteria | None) -> int:
    return {Criteria.LATENCY: 0, Criteria.THROUGHPUT: 1, None: 2}[c]


def deduce(
    calls: Sequence[DagCall],
    criteria: Mapping[str, Criteria],
    default: Objective = Objective.LATENCY,
) -> dict[str, Deduction]:
    """Deduce every call's objective. `criteria`: var_id -> the strongest criteria a get asked."""
    producer = {v: c.call_id for c in calls for v in c.output_var_ids}
    by_id = {c.call_id: c for c in calls}
    producers: dict[str, list[str]] = {}  # consumer -> distinct producer calls, in input order
    consumers: dict[str, list[str]] = {c.call_id: [] for c in calls}
    for call in calls:
        found = list(dict.fromkeys(producer[v] for v in call.input_var_ids if v in producer))
        producers[call.call_id] = found
        for p in found:
            consumers[p].append(call.call_id)

    urgency: dict[str, Criteria | None] = {}
    out: dict[str, Deduction] = {}
    for call_id in reversed(_topological(calls, producers)):
        call = by_id[call_id]
        asked: Criteria | None = None
        for v in call.output_var_ids:
            asked = _stronger(asked, criteria.get(v))
        u = asked
        for c in consumers[call_id]:
            u = _stronger(u, urgency[c])
        urgency[call_id] = u
        groups = [c for c in consumers[call_id] if len(producers[c]) >= 2]
        sole_of_latency = any(len(producers[c]) == 1 and urgency[c] is Criteria.LATENCY for c in consumers[call_id])
        if asked is Criteria.LATENCY or sole_of_latency:
            objective = Objective.LATENCY
        elif groups:
            objective = Objective.THROUGHPUT
        elif u is not None:
            objective = Objective.of(u)
        else:
            objective = default
        group = min(groups, key=lambda c: _rank(urgency[c])) if groups else None
        out[call_id] = Deduction(objective, u, group, 1 if u is Criteria.LATENCY else 0)
    return out


def _topological(calls: Sequence[DagCall], producers: Mapping[str, list[str]]) -> list[str]:
    """Call ids, producers before consumers (Kahn; ties in submission order). The DAG is acyclic."""
    num_waiting = {c.call_id: len(producers[c.call_id]) for c in calls}
    consumers: dict[str, list[str]] = {c.call_id: [] for c in calls}
    for c in calls:
        for p in producers[c.call_id]:
            consumers[p].append(c.call_id)
    ready = deque(c.call_id for c in calls if num_waiting[c.call_id] == 0)
    order: list[str] = []
    while ready:
        call_id = ready.popleft()
        order.append(call_id)
        for consumer in consumers[call_id]:
            num_waiting[consumer] -= 1
            if num_waiting[consumer] == 0:
                ready.append(consumer)
    assert len(order) == len(calls), "the session graph is acyclic"
    return order
