"""A session's status as the public API shows it (a read-only view of its graph and run records)."""

from __future__ import annotations

import collections

from parrot.protocol.public_api import CallStatus, EngineUsage, SessionStatus, SessionSummary
from parrot.serve.runtime.call_run import CallState
from parrot.serve.runtime.session import Session


def session_status(session: Session) -> SessionStatus:
    """What `GET /v1/sessions/{id}` shows: counts by state, each call's objective and usage, and
    per-engine totals."""
    runs = session.runs
    counts = collections.Counter(run.state for run in runs.values())
    calls = [
        CallStatus(
            call_id=c.call_id,
            name=c.name,
            state=r.state.value,
            objective=r.objective,
            urgency=r.urgency,
            task_group=r.task_group,
            priority=r.priority,
            engine_id=r.engine_id,
            num_attempts=r.num_attempts,
            num_prompt_tokens=r.num_prompt_tokens,
            num_cached_tokens=r.num_cached_tokens,
            num_computed_tokens=r.num_prompt_tokens - r.num_cached_tokens,
            num_early_filled_tokens=r.num_early_filled_tokens,
            num_generated_tokens=r.num_generated_tokens,
        )
        for c, r in ((c, runs[c.call_id]) for c in session.graph.calls.values())
    ]
    usage: dict[str, list[int]] = {}
    for call in calls:
        if call.engine_id is not None:
            totals = usage.setdefault(call.engine_id, [0, 0, 0])
            totals[0] += call.num_computed_tokens
            totals[1] += call.num_cached_tokens
            totals[2] += call.num_generated_tokens
    return SessionStatus(
        calls=calls,
        engines=[
            EngineUsage(engine_id=e, num_computed_tokens=c, num_cached_tokens=r, num_generated_tokens=g)
            for e, (c, r, g) in sorted(usage.items())
        ],
        session_id=session.session_id,
        num_variables=len(session.graph.variables),
        num_calls=len(session.graph.calls),
        num_calls_waiting=counts[CallState.WAITING],
        num_calls_running=counts[CallState.RUNNING],
        num_calls_done=counts[CallState.DONE],
        num_calls_failed=counts[CallState.FAILED],
        idle_timeout_s=session.idle_timeout_s,
        idle_s=session.idle_s(),
    )


def session_summary(session: Session) -> SessionSummary:
    """One line of `GET /v1/sessions`."""
    return SessionSummary(
        session_id=session.session_id,
        tenant=session.tenant,
        num_variables=len(session.graph.variables),
        num_calls=len(session.graph.calls),
        num_calls_open=session.num_open_calls,
        num_chars=session.num_chars,
        idle_s=round(session.idle_s(), 3),
    )
