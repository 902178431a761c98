"""A client that goes away stops its work: the engine stops generating and frees the blocks."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from live_server import LiveServer

from parrot.protocol.engine_api import EngineStats


def settle(server: LiveServer, timeout_s: float = 10.0) -> EngineStats:
    """The engine's stats once it runs nothing and its contexts are freed (or at the deadline)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = server.engine.engine.engine.stats()
        if (stats.num_running == 0 and stats.num_contexts == 0) or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


@pytest.mark.parametrize("stream", [True, False])
def test_an_abandoned_completion_stops_generating(server: LiveServer, stream: bool) -> None:
    before = settle(server)
    body = {"model": "tiny", "prompt": "Count forever:", "max_tokens": 2000, "ignore_eos": True, "stream": stream}
    key = {"Authorization": "Bearer k"}
    # Streaming, the client leaves after 3 events (however long they take on a loaded machine); not
    # streaming, it gives up waiting after 0.5 s of silence (a client-side timeout).
    with httpx.Client(base_url=server.url, timeout=httpx.Timeout(60, read=30 if stream else 0.5)) as http:
        if stream:
            with http.stream("POST", "/v1/completions", json=body, headers=key) as resp:
                events = (line for line in resp.iter_lines() if line)
                assert [next(events).startswith("data:") for _ in range(3)] == [True, True, True]
        else:
            with pytest.raises(httpx.ReadTimeout):
                http.post("/v1/completions", json=body, headers=key)
    after = settle(server)
    assert [after.num_running, after.num_contexts, after.num_blocks_free] == [0, 0, before.num_blocks_free]
    assert after.num_decode_tokens - before.num_decode_tokens < 1000  # stopped, not run to 2,000


def test_an_abandoned_get_stops_waiting_and_lets_the_session_expire(server: LiveServer) -> None:
    key = {"Authorization": "Bearer k"}
    with httpx.Client(base_url=server.url, timeout=httpx.Timeout(60, read=0.5)) as http:
        created = http.post("/v1/sessions", headers=key).json()
        auth = {"Authorization": f"Bearer {created['token']}"}
        sid = created["session_id"]
        assert http.post(f"/v1/sessions/{sid}/variables", json={"var_id": "never"}, headers=auth).status_code == 201
        with pytest.raises(httpx.ReadTimeout):
            http.get(f"/v1/sessions/{sid}/variables/never", params={"timeout_s": 300}, headers=auth)
        session = server.manager.sessions.sessions[sid]
        deadline = time.monotonic() + 10
        while session.num_waiting_gets and time.monotonic() < deadline:
            time.sleep(0.05)
        assert session.num_waiting_gets == 0  # idle again: it can expire


def test_a_stream_of_a_never_set_variable_ends_with_408(server: LiveServer) -> None:
    key = {"Authorization": "Bearer k"}
    with httpx.Client(base_url=server.url, timeout=30) as http:
        created = http.post("/v1/sessions", headers=key).json()
        auth = {"Authorization": f"Bearer {created['token']}"}
        sid = created["session_id"]
        assert http.post(f"/v1/sessions/{sid}/variables", json={"var_id": "never"}, headers=auth).status_code == 201
        url = f"/v1/sessions/{sid}/variables/never/stream"
        with http.stream("GET", url, params={"timeout_s": 0.3}, headers=auth) as resp:
            lines = [line for line in resp.iter_lines() if line]
        assert [json.loads(lines[-1])["error"]["status"]] == [408]
        assert server.manager.sessions.sessions[sid].num_waiting_gets == 0
