"""`parrot serve` as a process: SIGTERM drains, ends open streams with an error event, exits 0."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx


def test_sigterm_ends_streams_with_an_error_event_and_exits(tiny_model_folder: Path) -> None:
    cmd = [sys.executable, "-m", "parrot.cli", "serve", "--model", str(tiny_model_folder), "--dtype", "float32"]
    cmd += ["--port", "0", "--shutdown-grace-s", "0.5"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = None
        deadline = time.monotonic() + 120
        assert proc.stdout is not None
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            match = re.search(r"parrot manager on (http://\S+)", line)
            url = match.group(1) if match else None
        assert url is not None, "the server did not start"
        body = {"model": "tiny", "prompt": "Count:", "max_tokens": 3000, "ignore_eos": True, "stream": True}
        events: list[str] = []
        with (
            httpx.Client(base_url=url, timeout=60) as http,
            http.stream("POST", "/v1/completions", json=body, headers={"Authorization": "Bearer k"}) as resp,
        ):
            for line in resp.iter_lines():
                if line.startswith("data:"):
                    events.append(line[5:].strip())
                    if len(events) == 3:
                        os.kill(proc.pid, signal.SIGTERM)
        # The call could not finish in the grace period: its stream ends with the error, no [DONE].
        last = json.loads(events[-1])
        assert [last["error"]["status"], "manager stopped" in last["error"]["message"]] == [410, True]
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
