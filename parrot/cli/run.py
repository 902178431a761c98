"""`parrot run app.py [ARGS...]`: run an application against a manager, with a live display of its
calls (done / running / waiting) and, at the end, what it used and what Parrot saved.

The app runs as a child process with the same `parrot` package on its path and the manager in
`PARROT_URL` / `PARROT_API_KEY` (the examples' `--url` default reads them). The display polls
`GET /v1/status` (an operator key, or any key on a development manager): the sessions that appear
while the app runs are the app's.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

import parrot
from parrot.cli.client import KEY_ENV, URL_ENV, client, fetch_status, manager_args, savings
from parrot.protocol.ops_api import SessionSummary


def run_args(p: argparse.ArgumentParser) -> None:
    manager_args(p)
    p.add_argument("--app-api-key", help="the key the app uses (default: --api-key)")
    p.add_argument("--interval-s", type=float, default=0.2, help="how often the display polls the manager")
    p.add_argument("app", type=Path, help="a Python file")
    p.add_argument("args", nargs=argparse.REMAINDER, help="passed to the app")


def _line(sessions: dict[str, SessionSummary]) -> tuple[int, int, str]:
    s = list(sessions.values())
    done, calls = sum(x.num_calls_done + x.num_calls_failed for x in s), sum(x.num_calls for x in s)
    running, waiting = sum(x.num_calls_running for x in s), sum(x.num_calls_waiting for x in s)
    tokens = sum(x.num_generated_tokens for x in s)
    return done, calls, f"{len(s)} sessions: {running} running, {waiting} waiting, {tokens} tokens generated"


def cmd_run(a: argparse.Namespace) -> None:
    if not a.app.is_file():
        raise SystemExit(f"no such application file: {a.app}")
    root = str(Path(parrot.__file__).resolve().parents[1])
    env = dict(os.environ, **{URL_ENV: a.url, KEY_ENV: a.app_api_key or a.api_key})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    console = Console(stderr=True)
    with client(a) as http:
        before = fetch_status(http)
        known = {s.session_id for s in before.sessions}
        seen: dict[str, SessionSummary] = {}
        start = time.monotonic()
        proc = subprocess.Popen([sys.executable, str(a.app), *a.args], env=env)
        columns = [TextColumn("calls"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}")]
        with Progress(*columns, TimeElapsedColumn(), console=console, transient=False) as progress:
            task = progress.add_task("starting", total=None)
            while True:
                exited = proc.poll() is not None
                try:
                    st = fetch_status(http)
                except SystemExit:  # the manager went away meanwhile: the app will say
                    st = None
                if st is not None:
                    seen.update((s.session_id, s) for s in st.sessions if s.session_id not in known)
                    done, calls, text = _line(seen)
                    progress.update(task, completed=done, total=calls or None, description=text)
                if exited:
                    break
                time.sleep(a.interval_s)
            elapsed = time.monotonic() - start
            after = fetch_status(http)
            # The app's sessions close as it ends, often between two polls: the manager's counters
            # since the start say how many calls finished.
            finished = after.num_calls_finished - before.num_calls_finished
            generated = after.num_generated_tokens - before.num_generated_tokens
            _, calls, _ = _line(seen)
            progress.update(task, completed=finished, total=max(calls, finished), description=f"{generated} tokens")
    print(f"app exited {proc.returncode} after {elapsed:.1f} s: {savings(before, after)}", flush=True)
    if proc.returncode:
        raise SystemExit(proc.returncode)
