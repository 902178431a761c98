"""The operator's view of a manager: `GET /v1/status` (engines, sessions, queues, prefix reuse) and
`GET /v1/status/sessions/{id}/dag` (one session's DAG with each call's state and placement).

`parrot status`, `parrot run` and the web dashboard (`/dashboard`) read these; Prometheus reads
the same numbers at `GET /metrics`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class _Msg(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EngineSummary(_Msg):
    engine_id: str
    model: str
    url: str | None
    alive: bool
    heartbeat_age_s: float
    num_running_calls: int  # dispatched by the manager
    latency_cap: int
    num_blocks_total: int
    num_blocks_free: int
    kv_cache_usage: float  # fraction of KV blocks in use, 0 to 1
    num_running: int  # the engine's own count of running generations
    num_waiting: int
    num_prefix_contexts: int  # cached prefix contexts the manager holds there


class SessionSummary(_Msg):
    session_id: str
    num_variables: int
    num_calls: int
    num_calls_waiting: int
    num_calls_running: int
    num_calls_done: int
    num_calls_failed: int
    num_prompt_tokens: int
    num_cached_tokens: int
    num_generated_tokens: int
    idle_s: float


class QueueSummary(_Msg):
    """Calls of live sessions with one deduced objective."""

    objective: str
    num_waiting: int  # waiting for an input or an engine
    num_queued: int  # every input set, waiting for an engine
    num_running: int


class ClusterStatus(_Msg):
    engines: list[EngineSummary]
    sessions: list[SessionSummary]
    queues: list[QueueSummary]
    # Finished calls since the manager started: prompt tokens, those reused from prefixes other
    # calls computed, and the hit rate (reused / prompt; 0 when no prompt token yet).
    num_calls_finished: int
    num_prompt_tokens: int
    num_reused_tokens: int
    num_generated_tokens: int
    prefix_hit_rate: float
    # Gets and streams of variables: the client round trips paid (a request-level client pays one
    # per call; a DAG's intermediate values need none).
    num_variable_gets: int = 0


class DagNode(_Msg):
    node_id: str  # a call id or a variable id
    kind: str  # "call" | "variable"
    label: str
    state: str  # calls: waiting | running | done | failed; variables: pending | ready | error
    objective: str | None = None  # calls: the deduced objective
    engine_id: str | None = None
    queue_s: float | None = None  # calls: ready until dispatched
    run_s: float | None = None  # calls: dispatched until finished (or now)
    num_generated_tokens: int = 0
    num_cached_tokens: int = 0


class DagEdge(_Msg):
    src: str
    dst: str


class SessionDag(_Msg):
    session_id: str
    nodes: list[DagNode]
    edges: list[DagEdge]
