"""`parrot status`: a manager's engines, sessions, queues and prefix-cache hit rate."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from parrot.cli.client import client, fetch_status, manager_args
from parrot.protocol.ops_api import ClusterStatus


def status_args(p: argparse.ArgumentParser) -> None:
    manager_args(p)
    p.add_argument("--json", action="store_true", help="print GET /v1/status as JSON")


def cmd_status(a: argparse.Namespace) -> None:
    with client(a) as http:
        st = fetch_status(http)
    if a.json:
        print(st.model_dump_json(indent=2))
        return
    render_status(st, Console(width=140))


def render_status(st: ClusterStatus, console: Console) -> None:
    engines = Table(
        "engine", "model", "state", "calls / cap", "engine run / wait", "KV use", "prefixes", title="Engines"
    )
    for e in st.engines:
        engines.add_row(
            e.engine_id,
            e.model,
            "alive" if e.alive else "dead",
            f"{e.num_running_calls} / {e.latency_cap}",
            f"{e.num_running} / {e.num_waiting}",
            f"{e.kv_cache_usage:.1%} of {e.num_blocks_total} blocks",
            str(e.num_prefix_contexts),
        )
    queues = Table("objective", "waiting", "queued (inputs ready)", "running", title="Queues")
    for q in st.queues:
        queues.add_row(q.objective, str(q.num_waiting), str(q.num_queued), str(q.num_running))
    sessions = Table("session", "calls", "waiting", "running", "done", "failed", "reused tokens", title="Sessions")
    for s in st.sessions:
        sessions.add_row(
            s.session_id,
            str(s.num_calls),
            str(s.num_calls_waiting),
            str(s.num_calls_running),
            str(s.num_calls_done),
            str(s.num_calls_failed),
            str(s.num_cached_tokens),
        )
    console.print(engines, queues, sessions)
    console.print(
        f"prefix cache: {st.num_reused_tokens} of {st.num_prompt_tokens} prompt tokens reused "
        f"(hit rate {st.prefix_hit_rate:.1%}); {st.num_calls_finished} calls finished, "
        f"{st.num_generated_tokens} tokens generated"
    )
