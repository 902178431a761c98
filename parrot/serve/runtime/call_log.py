"""The manager's request log: one info line per finished call, on the `parrot.serve.calls` logger.

Semantic calls and OpenAI-route requests alike (each OpenAI choice is a call of a one-call session).
The line is built once, when the call finishes, from the counters its run record already holds;
with the logger off (below INFO), nothing is formatted.

    call finished: session=s-1a2b-… call=c3 name=summarize engine=e0 state=done objective=throughput
    prompt_tokens=412 computed=76 reused=336 output_tokens=48 latency_s=1.214

`computed` + `reused` = `prompt_tokens`: reused are the tokens whose KV came from prefixes other
calls computed. `latency_s`: from the moment all its inputs were set (a plain request: its arrival)
to its end (0 for a call that failed before that).
"""

from __future__ import annotations

import logging

from parrot.serve.runtime.call_run import CallRun

log = logging.getLogger("parrot.serve.calls")

FORMAT = (
    "call finished: session=%s call=%s name=%s engine=%s state=%s objective=%s "
    "prompt_tokens=%d computed=%d reused=%d output_tokens=%d latency_s=%.3f"
)


def log_finished(session_id: str, run: CallRun) -> None:
    """The executor's `on_finish`: `run` just became done or failed."""
    if not log.isEnabledFor(logging.INFO):
        return
    end = run.finished_at
    start = next((t for t in (run.ready_at, run.dispatched_at) if t is not None), end)
    latency_s = end - start if end is not None and start is not None else 0.0
    log.info(
        FORMAT,
        session_id,
        run.call.call_id,
        run.call.name or "-",
        run.engine_id or "-",
        run.state.value,
        run.objective.value,
        run.num_prompt_tokens,
        run.num_prompt_tokens - run.num_cached_tokens,
        run.num_cached_tokens,
        run.num_generated_tokens,
        latency_s,
    )
