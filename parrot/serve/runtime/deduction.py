"""Applies objective deduction (policy/objectives.py) to a session's graph."""

from __future__ import annotations

from parrot.protocol.objective import Objective
from parrot.serve.policy.objectives import DagCall, Deduction, deduce
from parrot.serve.runtime.graph import SessionGraph


def apply_deductions(graph: SessionGraph, default: Objective, deduction: bool = True) -> list[str]:
    """Deduce the session's objectives (or, with `deduction` off, give every call `default`) and
    store them on its CallNodes; returns the ids of the calls whose deduction changed."""
    deduced = deduce_session(graph, default) if deduction else {}
    changed = []
    for call in graph.calls.values():
        d = deduced.get(call.call_id)
        new = (d.objective, d.urgency, d.task_group, d.priority) if d else (default, None, None, 0)
        if new != (call.objective, call.urgency, call.task_group, call.priority):
            call.objective, call.urgency, call.task_group, call.priority = new
            changed.append(call.call_id)
    return changed


def deduce_session(graph: SessionGraph, default: Objective = Objective.LATENCY) -> dict[str, Deduction]:
    """`deduce` over a session's graph (variables carry the criteria their gets asked for)."""
    calls = [DagCall(c.call_id, tuple(c.input_var_ids), tuple(c.outputs.values())) for c in graph.calls.values()]
    criteria = {v.var_id: v.criteria for v in graph.variables.values() if v.criteria is not None}
    return deduce(calls, criteria, default)
