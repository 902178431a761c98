"""A batch with megabytes of text is tokenized off the event loop: the manager keeps answering
other requests meanwhile, and the batch is still checked (and refused) exactly."""

from __future__ import annotations

import threading
import time

import httpx
from live_server import LiveServer

KEY = {"Authorization": "Bearer k"}


def test_the_manager_answers_while_a_big_batch_is_tokenized(server: LiveServer) -> None:
    key = {"Authorization": "Bearer k"}
    big = "The quick brown fox jumps over the lazy dog. " * 45_000  # ~2 MB, ~450k tokens
    with httpx.Client(base_url=server.url, timeout=120) as http:
        created = http.post("/v1/sessions", headers=key).json()
        auth = {"Authorization": f"Bearer {created['token']}"}
        submit = {
            "calls": [
                {"template": "Summarize: {{input:doc}}\nSummary:{{output:s}}", "bindings": {"doc": {"value": big}}}
            ]
        }
        result: dict[str, object] = {}

        def post() -> None:
            t0 = time.monotonic()
            resp = http.post(f"/v1/sessions/{created['session_id']}/submit", json=submit, headers=auth)
            result["status"], result["field"] = resp.status_code, resp.json()["error"]["field"]
            result["seconds"] = time.monotonic() - t0

        worker = threading.Thread(target=post)
        worker.start()
        waits = []
        with httpx.Client(base_url=server.url, timeout=30) as probe:
            while worker.is_alive():
                t0 = time.monotonic()
                assert probe.get("/health").status_code == 200
                waits.append(time.monotonic() - t0)
                time.sleep(0.02)
        worker.join()
    # Refused exactly as before (too long for the model), after tokenizing it all.
    assert [result["status"], result["field"]] == [400, "calls[0].template"]
    # The loop answered health checks throughout: many of them, none waiting for the tokenization.
    assert len(waits) >= 5, result
    assert max(waits) < 0.5 * float(result["seconds"]), (max(waits), result)  # type: ignore[arg-type]


def test_the_manager_answers_while_a_big_chat_conversation_is_rendered(server: LiveServer) -> None:
    # Many messages of ~0.9 MB in all: the chat template renders the conversation and its prefixes
    # at message boundaries, and counts its tokens (no max_tokens), all off the event loop.
    line = "The quick brown fox jumps over the lazy dog. " * 450
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": line} for i in range(45)]
    result: dict[str, object] = {}

    def post() -> None:
        t0 = time.monotonic()
        with httpx.Client(base_url=server.url, timeout=120) as http:
            body = {"model": "tiny", "messages": messages}
            resp = http.post("/v1/chat/completions", json=body, headers=KEY)
        result["status"], result["field"] = resp.status_code, resp.json()["error"]["field"]
        result["seconds"] = time.monotonic() - t0

    worker = threading.Thread(target=post)
    worker.start()
    waits = []
    with httpx.Client(base_url=server.url, timeout=30) as probe:
        while worker.is_alive():
            t0 = time.monotonic()
            assert probe.get("/health").status_code == 200
            waits.append(time.monotonic() - t0)
            time.sleep(0.02)
    worker.join()
    assert [result["status"], result["field"]] == [400, "messages"]  # too long for the model, said plainly
    # Past the size limit, refused before any rendering.
    big = [{"role": "user", "content": line * 3}] * 100
    with httpx.Client(base_url=server.url, timeout=30) as http:
        resp = http.post("/v1/chat/completions", json={"model": "tiny", "messages": big}, headers=KEY)
    assert [resp.status_code, resp.json()["error"]["field"]] == [413, "messages"]
    assert len(waits) >= 5, result
    assert max(waits) < 0.5 * float(result["seconds"]), (max(waits), result)  # type: ignore[arg-type]
