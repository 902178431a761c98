"""The demo: the example applications run twice against one manager, then what Parrot saved.

1. Through Parrot sessions: each app's calls are submitted at once as one DAG; while it runs, a
   live display (rich) shows its calls (done of submitted, running, waiting) and tokens generated,
   read from the manager's `GET /v1/status`.
2. The request-level way: the same apps, each call rendered by the client and sent as a plain
   chat completion, waiting for its answer before the next (request_level.py), on the same
   manager and engine, in the same run.

Then each app's result and the summary (savings.py): prompt tokens reused, client round trips
avoided and the time of both runs, every figure from the manager's counters or the clock.

run_demo(base_url, document_text) -> DemoResult
"""

from __future__ import annotations

import concurrent.futures
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from examples.chain_summary import chain_summary, chain_summary_request_level
from examples.doc_questions import doc_questions, doc_questions_request_level
from examples.map_reduce_summary import map_reduce_summary, map_reduce_summary_request_level
from examples.request_level import RequestLevel
from examples.savings import Phase, summary_lines
from parrot.cli.client import fetch_status
from parrot.protocol.ops_api import ClusterStatus, SessionSummary

POLL_S = 0.25


@dataclass(frozen=True)
class App:
    name: str
    run: Callable[[str, str, str | None], str]  # (document, base_url, api_key): through a Parrot session
    run_request_level: Callable[[str, RequestLevel], str]


APPS = [
    App("questions over one document", doc_questions, doc_questions_request_level),
    App("map-reduce summary", map_reduce_summary, map_reduce_summary_request_level),
    App("chain summary", chain_summary, chain_summary_request_level),
]


@dataclass(frozen=True)
class AppRun:
    name: str
    num_calls: int
    result: str
    seconds: float
    request_level_result: str
    request_level_seconds: float


@dataclass(frozen=True)
class DemoResult:
    apps: list[AppRun]
    parrot: Phase
    request_level: Phase
    lines: list[str]  # the summary


class _Display:
    """One progress line per app and run, on stderr."""

    def __init__(self) -> None:
        columns = [TextColumn("{task.fields[app]:<28}"), TextColumn("{task.fields[mode]:<13}")]
        columns += [BarColumn(bar_width=10), MofNCompleteColumn(), TextColumn("{task.description}")]
        columns.append(TimeElapsedColumn())
        self.progress = Progress(*columns, console=Console(stderr=True))

    def watch(
        self, app: str, mode: str, work: Callable[[], str], poll: Callable[[TaskID], None]
    ) -> tuple[str, float, TaskID]:
        """Run `work` on a thread, calling `poll(task)` until it ends: its result, seconds and task."""
        task = self.progress.add_task("starting", total=None, app=app, mode=mode)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            start = time.perf_counter()
            future = pool.submit(work)
            while True:
                done = future.done()
                poll(task)
                if done:
                    break
                time.sleep(POLL_S)
            result = future.result()
        return result, time.perf_counter() - start, task


def run_demo(
    base_url: str, document: str, api_key: str | None = None, print_fn: Callable[[str], None] = print
) -> DemoResult:
    headers = {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
    display = _Display()
    with httpx.Client(base_url=base_url, headers=headers, timeout=10.0) as http, display.progress:
        first = fetch_status(http)
        parrot_runs, middle = _through_sessions(http, display, document, base_url, api_key, first)
        with RequestLevel(base_url, api_key) as client:
            request_level_runs = [
                _one_request_at_a_time(display, app, document, client, num_calls)
                for app, (_, num_calls, _) in zip(APPS, parrot_runs, strict=True)
            ]
        last = fetch_status(http)
    apps = [
        AppRun(app.name, num_calls, result, seconds, rl_result, rl_seconds)
        for app, (result, num_calls, seconds), (rl_result, rl_seconds) in zip(
            APPS, parrot_runs, request_level_runs, strict=True
        )
    ]
    parrot = Phase.between(first, middle, sum(a.seconds for a in apps))
    request_level = Phase.between(middle, last, sum(a.request_level_seconds for a in apps))
    num_same = sum(a.result == a.request_level_result for a in apps)
    lines = summary_lines(parrot, request_level, num_same, len(apps))
    for a in apps:
        print_fn(f"== {a.name}: {a.num_calls} calls, {a.seconds:.1f} s (request-level {a.request_level_seconds:.1f} s)")
        print_fn(a.result.strip() + "\n")
    for line in lines:
        print_fn(line)
    return DemoResult(apps, parrot, request_level, lines)


def _through_sessions(
    http: httpx.Client, display: _Display, document: str, base_url: str, api_key: str | None, before: ClusterStatus
) -> tuple[list[tuple[str, int, float]], ClusterStatus]:
    """Each app through Parrot sessions: (result, calls, seconds) each, and the status after the last."""
    runs = []
    for app in APPS:
        known = {s.session_id for s in before.sessions}
        seen: dict[str, SessionSummary] = {}

        def poll(task: TaskID, known: set[str] = known, seen: dict[str, SessionSummary] = seen) -> None:
            st = fetch_status(http)
            seen.update((s.session_id, s) for s in st.sessions if s.session_id not in known)
            _show_sessions(display.progress, task, list(seen.values()))

        work = functools.partial(app.run, document, base_url, api_key)
        result, seconds, task = display.watch(app.name, "Parrot", work, poll)
        after = fetch_status(http)  # its sessions are closed: the counters hold all of its calls
        num_calls = after.num_calls_finished - before.num_calls_finished
        generated = after.num_generated_tokens - before.num_generated_tokens
        display.progress.update(task, completed=num_calls, total=num_calls, description=f"calls, {generated} tokens")
        runs.append((result, num_calls, seconds))
        before = after
    return runs, before


def _one_request_at_a_time(
    display: _Display, app: App, document: str, client: RequestLevel, num_calls: int
) -> tuple[str, float]:
    start_requests = client.num_requests

    def count(task: TaskID) -> None:
        done = client.num_requests - start_requests
        display.progress.update(task, completed=done, total=num_calls, description="calls, one at a time")

    work = functools.partial(app.run_request_level, document, client)
    result, seconds, _ = display.watch(app.name, "request-level", work, count)
    return result, seconds


def _show_sessions(progress: Progress, task: TaskID, sessions: list[SessionSummary]) -> None:
    done = sum(x.num_calls_done + x.num_calls_failed for x in sessions)
    running, waiting = sum(x.num_calls_running for x in sessions), sum(x.num_calls_waiting for x in sessions)
    tokens = sum(x.num_generated_tokens for x in sessions)
    text = f"calls, {running} running, {waiting} waiting, {tokens} tokens"
    progress.update(task, completed=done, total=sum(x.num_calls for x in sessions) or None, description=text)
