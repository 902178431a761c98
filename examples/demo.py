"""The demo applications, run one after another against a manager: what `make demo` shows.

While each app runs, a live display (rich) shows its calls (done of submitted, running, waiting)
and tokens generated, read from the manager's `GET /v1/status`; then each app's result, and one
line of what Parrot saved: client round trips and prompt tokens reused from shared prefixes.

run_demo(base_url, document_text) -> list of (name, result, seconds)
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from examples.chain_summary import chain_summary
from examples.map_reduce_summary import map_reduce_summary
from examples.multi_output import tell_joke
from examples.native_pipeline import titled
from parrot.cli.client import fetch_status, savings
from parrot.protocol.ops_api import ClusterStatus, SessionSummary


def _status(http: httpx.Client) -> ClusterStatus | None:
    try:
        return fetch_status(http)
    except SystemExit:  # a manager that needs an operator key: no live display
        return None


def _show(progress: Progress, task: TaskID, seen: dict[str, SessionSummary]) -> None:
    s = list(seen.values())
    done = sum(x.num_calls_done + x.num_calls_failed for x in s)
    running, waiting = sum(x.num_calls_running for x in s), sum(x.num_calls_waiting for x in s)
    tokens = sum(x.num_generated_tokens for x in s)
    text = f"{running} running, {waiting} waiting, {tokens} tokens"
    progress.update(task, completed=done, total=sum(x.num_calls for x in s) or None, description=text)


def run_demo(
    base_url: str, document: str, api_key: str = "parrot", print_fn: Callable[[str], None] = print
) -> list[tuple[str, str, float]]:
    apps: list[tuple[str, Callable[[], str]]] = [
        ("chain summary", lambda: chain_summary(document, base_url, api_key)),
        ("map-reduce summary", lambda: map_reduce_summary(document, base_url, api_key)),
        ("multi-output (joke + explanation)", lambda: "\n".join(tell_joke("parrots", base_url, api_key))),
        ("native function in a pipeline", lambda: titled(document, base_url, api_key)),
    ]
    results = []
    columns = [TextColumn("{task.fields[app]:<34}"), BarColumn(), MofNCompleteColumn(), TextColumn("calls")]
    columns += [TextColumn("{task.description}"), TimeElapsedColumn()]
    headers = {"Authorization": f"Bearer {api_key}"}
    with (
        httpx.Client(base_url=base_url, headers=headers, timeout=10.0) as http,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        first = _status(http)
        with Progress(*columns, console=Console(stderr=True)) as progress:
            for name, app in apps:
                task = progress.add_task("starting", total=None, app=name)
                before = _status(http)
                known = {s.session_id for s in before.sessions} if before is not None else set()
                seen: dict[str, SessionSummary] = {}
                start = time.perf_counter()
                future = pool.submit(app)
                while True:
                    finished = future.done()
                    st = _status(http) if before is not None else None
                    if st is not None:
                        seen.update((s.session_id, s) for s in st.sessions if s.session_id not in known)
                        _show(progress, task, seen)
                    if finished:
                        break
                    time.sleep(0.25)
                after = _status(http) if before is not None else None
                if before is not None and after is not None:  # its sessions closed: the counters say
                    finished = after.num_calls_finished - before.num_calls_finished
                    tokens = after.num_generated_tokens - before.num_generated_tokens
                    progress.update(task, completed=finished, total=finished, description=f"{tokens} tokens")
                result = future.result()
                results.append((name, result, time.perf_counter() - start))
        for name, result, seconds in results:
            print_fn(f"== {name} ({seconds:.2f} s end to end)\n{result.strip()}\n")
        last = _status(http)
    if first is not None and last is not None:
        print_fn(f"Parrot: {savings(first, last)}")
    return results
