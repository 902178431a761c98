"""The operator's views of the manager's state (read-only): the cluster status, one session's DAG,
and that DAG as Graphviz DOT text for the dashboard (the layout is Graphviz's, `dot -Tsvg`)."""

from __future__ import annotations

import collections

from parrot.protocol.ops_api import (
    ClusterStatus,
    DagEdge,
    DagNode,
    EngineSummary,
    QueueSummary,
    SessionDag,
    SessionSummary,
)
from parrot.serve.runtime.call_run import CallState
from parrot.serve.runtime.engines import EnginePool
from parrot.serve.runtime.metrics import OBJECTIVES, ServeMetrics
from parrot.serve.runtime.prefix_cache import PrefixCache
from parrot.serve.runtime.session import Session, SessionRegistry


def cluster_status(
    sessions: SessionRegistry, pool: EnginePool, prefix_cache: PrefixCache, metrics: ServeMetrics
) -> ClusterStatus:
    now = pool.clock.now()
    engines = []
    for h in pool.handles.values():
        st = h.stats
        used = st.num_blocks_total - st.num_blocks_free
        engines.append(
            EngineSummary(
                engine_id=h.engine_id,
                model=h.model,
                url=h.url,
                alive=h.alive,
                heartbeat_age_s=now - h.last_heartbeat,
                num_running_calls=h.num_running_calls,
                latency_cap=min(h.latency_cap, 1 << 20),
                num_blocks_total=st.num_blocks_total,
                num_blocks_free=st.num_blocks_free,
                kv_cache_usage=used / st.num_blocks_total if st.num_blocks_total else 0.0,
                num_running=st.num_running,
                num_waiting=st.num_waiting,
                num_prefix_contexts=len(prefix_cache.entries(h.engine_id)),
            )
        )
    summaries = []
    queues: dict[str, collections.Counter[str]] = {o: collections.Counter() for o in OBJECTIVES}
    for s in sessions.sessions.values():
        runs = list(s.runs.values())
        counts = collections.Counter(r.state for r in runs)
        for r in runs:
            q = queues[r.objective.value]
            q["running"] += r.state is CallState.RUNNING
            q["waiting"] += r.state is CallState.WAITING
            q["queued"] += r.state is CallState.WAITING and r.ready_since is not None
        summaries.append(
            SessionSummary(
                session_id=s.session_id,
                num_variables=len(s.graph.variables),
                num_calls=len(s.graph.calls),
                num_calls_waiting=counts[CallState.WAITING],
                num_calls_running=counts[CallState.RUNNING],
                num_calls_done=counts[CallState.DONE],
                num_calls_failed=counts[CallState.FAILED],
                num_prompt_tokens=sum(r.num_prompt_tokens for r in runs),
                num_cached_tokens=sum(r.num_cached_tokens for r in runs),
                num_generated_tokens=sum(r.num_generated_tokens for r in runs),
                idle_s=s.idle_s(now),
            )
        )
    t = metrics.totals
    return ClusterStatus(
        engines=engines,
        sessions=summaries,
        queues=[
            QueueSummary(objective=o, num_waiting=q["waiting"], num_queued=q["queued"], num_running=q["running"])
            for o, q in queues.items()
        ],
        num_calls_finished=t["calls"],
        num_prompt_tokens=t["prompt"],
        num_reused_tokens=t["reused"],
        num_generated_tokens=t["generated"],
        prefix_hit_rate=t["reused"] / t["prompt"] if t["prompt"] else 0.0,
        num_variable_gets=t["gets"],
    )


def session_dag(session: Session) -> SessionDag:
    """Calls and variables as nodes; an edge from each input variable to its call and from each
    call to its output variables."""
    now = session.clock.now()
    nodes, edges = [], []
    for var in session.graph.variables.values():
        nodes.append(DagNode(node_id=var.var_id, kind="variable", label=var.name or var.var_id, state=var.state.value))
    for call in session.graph.calls.values():
        run = session.runs.get(call.call_id)
        node = DagNode(node_id=call.call_id, kind="call", label=call.name or call.call_id, state="waiting")
        if run is not None:
            start = run.dispatched_at
            node.state, node.objective, node.engine_id = run.state.value, run.objective.value, run.engine_id
            node.num_generated_tokens, node.num_cached_tokens = run.num_generated_tokens, run.num_cached_tokens
            if start is not None:
                node.run_s = (run.finished_at or now) - start
                if run.ready_at is not None:
                    node.queue_s = max(start - run.ready_at, 0.0)
        nodes.append(node)
        edges += [DagEdge(src=v, dst=call.call_id) for v in call.inputs.values()]
        edges += [DagEdge(src=call.call_id, dst=v) for v in call.outputs.values()]
    return SessionDag(session_id=session.session_id, nodes=nodes, edges=edges)


# Fill colors by state; a call's border by its deduced objective.
STATE_COLORS = {
    "waiting": "#e5e7eb",
    "running": "#fde68a",
    "done": "#86efac",
    "failed": "#fca5a5",
    "pending": "#f3f4f6",
    "ready": "#bbf7d0",
    "error": "#fecaca",
}
OBJECTIVE_COLORS = {"latency": "#dc2626", "throughput": "#2563eb"}


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'


def dag_dot(dag: SessionDag) -> str:
    """The DAG as DOT text: each node's SVG id is its node id and its SVG class names its kind,
    state and objective (`call state_done objective_throughput`; Graphviz would escape a hyphen),
    which the dashboard and its browser test read."""
    lines = ["digraph dag {", "  rankdir=LR;", '  node [fontname="Helvetica", fontsize=10, style=filled];']
    for n in dag.nodes:
        classes = [n.kind, f"state_{n.state}"] + ([f"objective_{n.objective}"] if n.objective else [])
        attrs = {
            "id": n.node_id,
            "class": " ".join(classes),
            "fillcolor": STATE_COLORS.get(n.state, "#ffffff"),
            "shape": "box" if n.kind == "call" else "ellipse",
        }
        if n.kind == "call":
            detail = [n.state, n.objective or ""]
            if n.engine_id:
                detail.append(f"on {n.engine_id}")
            if n.run_s is not None:
                detail.append(f"{n.run_s:.2f}s")
            attrs["label"] = f"{n.label.replace(chr(92), '/')}\\n{' '.join(d for d in detail if d)}"
            attrs["color"] = OBJECTIVE_COLORS.get(n.objective or "", "#6b7280")
            attrs["penwidth"] = "2"
            attrs["tooltip"] = f"{n.node_id}: {n.num_generated_tokens} tokens generated, {n.num_cached_tokens} reused"
        else:
            attrs["label"] = n.label.replace("\\", "/")
        body = ", ".join(f"{k}={_quote(v) if k != 'label' else _label(v)}" for k, v in attrs.items())
        lines.append(f"  {_quote(n.node_id)} [{body}];")
    lines += [f"  {_quote(e.src)} -> {_quote(e.dst)};" for e in dag.edges]
    lines.append("}")
    return "\n".join(lines) + "\n"


def _label(text: str) -> str:
    """A label keeps its `\\n` line breaks (DOT escapes), everything else quoted."""
    return '"' + text.replace('"', '\\"').replace("\n", " ") + '"'
