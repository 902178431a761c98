"""A batch with megabytes of text is tokenized off the event loop: the manager keeps answering
other requests meanwhile, and the batch is still checked (and refused) exactly. The same for a long
chat conversation, rendered by the chat template."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx
from live_server import LiveServer

KEY = {"Authorization": "Bearer k"}


def post_while_probing(server: LiveServer, post: Callable[[httpx.Client], httpx.Response]) -> dict[str, object]:
    """Run `post` on a thread while polling /health; its status and error field, how long it took,
    and the health checks' waits."""
    result: dict[str, object] = {}

    def work() -> None:
        t0 = time.monotonic()
        with httpx.Client(base_url=server.url, timeout=120) as http:
            resp = post(http)
        result["status"], result["field"] = resp.status_code, resp.json()["error"]["field"]
        result["seconds"] = time.monotonic() - t0

    worker = threading.Thread(target=work)
    worker.start()
    waits = []
    with httpx.Client(base_url=server.url, timeout=30) as probe:
        while worker.is_alive():
            t0 = time.monotonic()
            assert probe.get("/health").status_code == 200
            waits.append(time.monotonic() - t0)
            time.sleep(0.02)
    worker.join()
    result["waits"] = waits
    return result


def assert_answered_throughout(result: dict[str, object]) -> None:
    """Many health checks answered, none waiting for the work."""
    waits: list[float] = result["waits"]  # type: ignore[assignment]
    assert len(waits) >= 5, result
    assert max(waits) < 0.5 * float(result["seconds"]), (max(waits), result)  # type: ignore[arg-type]


def test_the_manager_answers_while_a_big_batch_is_tokenized(server: LiveServer) -> None:
    big = "The quick brown fox jumps over the lazy dog. " * 45_000  # ~2 MB, ~450k tokens
    created = httpx.post(server.url + "/v1/sessions", headers=KEY).json()
    auth = {"Authorization": f"Bearer {created['token']}"}
    doc = {"doc": {"value": big}}
    submit = {"calls": [{"template": "Summarize: {{input:doc}}\nSummary:{{output:s}}", "bindings": doc}]}
    url = f"/v1/sessions/{created['session_id']}/submit"
    result = post_while_probing(server, lambda http: http.post(url, json=submit, headers=auth))
    # Refused exactly as before (too long for the model), after tokenizing it all.
    assert [result["status"], result["field"]] == [400, "calls[0].template"]
    assert_answered_throughout(result)


def test_the_manager_answers_while_a_big_chat_conversation_is_rendered(server: LiveServer) -> None:
    # Many messages of ~0.9 MB in all: the chat template renders the conversation and its prefixes
    # at message boundaries, and counts its tokens (no max_tokens), all off the event loop.
    line = "The quick brown fox jumps over the lazy dog. " * 450
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": line} for i in range(45)]
    body = {"model": "tiny", "messages": messages}
    result = post_while_probing(server, lambda http: http.post("/v1/chat/completions", json=body, headers=KEY))
    assert [result["status"], result["field"]] == [400, "messages"]  # too long for the model, said plainly
    assert_answered_throughout(result)
    # Past the size limit, refused before any rendering.
    big = [{"role": "user", "content": line * 3}] * 100
    resp = httpx.post(server.url + "/v1/chat/completions", json={"model": "tiny", "messages": big}, headers=KEY)
    assert [resp.status_code, resp.json()["error"]["field"]] == [413, "messages"]


def test_the_manager_answers_while_a_long_completion_prompt_is_tokenized(server: LiveServer) -> None:
    prompt = "The quick brown fox jumps over the lazy dog. " * 20_000  # ~0.9 MB
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 4}
    result = post_while_probing(server, lambda http: http.post("/v1/completions", json=body, headers=KEY))
    assert [result["status"], result["field"]] == [400, "prompt"]  # too long for the model, said plainly
    assert_answered_throughout(result)
