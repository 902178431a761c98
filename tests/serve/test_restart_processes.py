"""A manager restarted against an engine that outlived it, as processes: after kill -9 and after
SIGTERM, every output equals the first run's (float32, greedy); a killed run's contexts come back
once its lease runs out, while the new run's stay; a drained run frees its own."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

SYSTEM = "You are a careful assistant; you answer in one line and check every fact twice. " * 3
QUESTIONS = ["Why is the sky blue?", "How do bees fly?", "What is rain?"]


@contextmanager
def process(args: list[str], ready: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """Run `python -m parrot.cli ARGS` until the block ends; yield it and the URL its `ready` line names."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "parrot.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        assert proc.stdout is not None
        deadline, url = time.monotonic() + 120, None
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            match = re.search(ready + r" (http://\S+)", proc.stdout.readline())
            url = match.group(1) if match else None
        assert url is not None, f"{args[0]} did not start"
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)


def manager(engine_url: str) -> Callable[[], object]:
    args = ["serve", "--no-builtin", "--engine-url", engine_url, "--port", "0"]
    return lambda: process([*args, "--context-lease-s", "1", "--shutdown-grace-s", "5"], "parrot manager on")


def answers(url: str) -> list[str]:
    """One call per session, all sharing SYSTEM as their prompt prefix."""
    out = []
    with httpx.Client(base_url=url, timeout=60, headers={"Authorization": "Bearer k"}) as http:
        for question in QUESTIONS:
            session = http.post("/v1/sessions").json()
            auth = {"Authorization": f"Bearer {session['token']}"}
            call = {
                "template": SYSTEM + "Q: {{input:q}}\nA:{{output:a}}",
                "bindings": {"q": {"value": question}},
                "default_sampling": {"max_tokens": 8, "temperature": 0.0, "ignore_eos": True},
            }
            sid = session["session_id"]
            outputs = http.post(f"/v1/sessions/{sid}/calls", json=call, headers=auth).json()["outputs"]
            got = http.get(f"/v1/sessions/{sid}/variables/{outputs['a']}", params={"timeout_s": 60}, headers=auth)
            assert got.status_code == 200, got.text
            out.append(got.json()["value"])
    return out


def num_contexts(engine_url: str) -> int:
    return int(httpx.get(f"{engine_url}/v1/engine/stats", timeout=10).json()["num_contexts"])


def wait_contexts(engine_url: str, expected: int, timeout_s: float = 20.0) -> int:
    deadline = time.monotonic() + timeout_s
    while (n := num_contexts(engine_url)) != expected and time.monotonic() < deadline:
        time.sleep(0.1)
    return n


def test_outputs_survive_kill_and_sigterm_and_a_dead_runs_contexts_come_back(tiny_model_folder: Path) -> None:
    engine_args = ["engine", "--model", str(tiny_model_folder), "--dtype", "float32", "--port", "0"]
    with process(engine_args, r"parrot engine \(\S+\) on") as (_, engine_url):
        start_manager = manager(engine_url)
        with start_manager() as (first, url):
            expected = answers(url)
            per_run = num_contexts(engine_url)  # the cached SYSTEM prefixes stay on the engine
            assert per_run > 0
            os.kill(first.pid, signal.SIGKILL)  # no clean-up at all
            first.wait(timeout=30)
        with start_manager() as (second, url):  # the dead run's contexts may still be there
            assert answers(url) == expected
            assert wait_contexts(engine_url, per_run) == per_run  # the dead run's lease ran out, not this one's
            time.sleep(2.5)  # 2.5 leases: this run renews its own
            assert num_contexts(engine_url) == per_run
            assert answers(url) == expected
            os.kill(second.pid, signal.SIGTERM)
            assert second.wait(timeout=60) == 0
        assert wait_contexts(engine_url, 0, timeout_s=5) == 0  # a drained run frees its own
        with start_manager() as (_, url):
            assert answers(url) == expected
