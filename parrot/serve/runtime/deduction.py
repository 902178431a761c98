"""Applies objective deduction (policy/objectives.py) to a session: the graph in, the calls' run
records (call_run.py) updated."""

from __future__ import annotations

from collections.abc import Mapping

from parrot.protocol.objective import Objective
from parrot.serve.policy.objectives import DagCall, Deduction, deduce
from parrot.serve.runtime.call_run import CallRun
from parrot.serve.runtime.graph import SessionGraph


def apply_deductions(
    graph: SessionGraph, runs: Mapping[str, CallRun], default: Objective, deduction: bool = True
) -> list[str]:
    """Deduce the session's objectives (or, with `deduction` off, give every call `default`) and
    store them on the calls' run records; returns the ids of the calls whose deduction changed."""
    deduced = deduce_session(graph, default) if deduction else {}
    changed = []
    for call_id in graph.calls:
        run = runs[call_id]
        d = deduced.get(call_id)
        new = (d.objective, d.urgency, d.task_group, d.priority) if d else (default, None, None, 0)
        if new != (run.objective, run.urgency, run.task_group, run.priority):
            run.objective, run.urgency, run.task_group, run.priority = new
            changed.append(call_id)
    return changed


def deduce_session(graph: SessionGraph, default: Objective = Objective.LATENCY) -> dict[str, Deduction]:
    """`deduce` over a session's graph (variables carry the criteria their gets asked for)."""
    calls = [DagCall(c.call_id, tuple(c.input_var_ids), tuple(c.outputs.values())) for c in graph.calls.values()]
    criteria = {v.var_id: v.criteria for v in graph.variables.values() if v.criteria is not None}
    return deduce(calls, criteria, default)
