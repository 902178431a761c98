"""Over HTTP: registering an engine by URL while serving, listing engines, and OpenAI chat
requests that reuse a cached system prompt (usage.prompt_tokens_details.cached_tokens)."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
from engine_farm import farm
from live_server import LiveServer, serve_app

from parrot.engine.async_engine import AsyncEngine
from parrot.serve import create_app, create_manager
from parrot.text import Tokenizer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_register_and_list_engines(server: LiveServer) -> None:
    key = {"Authorization": "Bearer k"}
    with farm(server.engine.model_folder, 1) as (extra,), httpx.Client(base_url=server.url, timeout=60) as http:
        listed = http.get("/v1/engines", headers=key).json()["engines"]
        assert [(e["engine_id"], e["url"], e["alive"]) for e in listed] == [("e0", None, True)]
        resp = http.post("/v1/engines", json={"url": extra.url, "max_running_calls": 8}, headers=key)
        assert resp.status_code == 201, resp.text
        info = resp.json()
        assert [info["engine_id"], info["url"], info["model"], info["alive"]] == ["e1", extra.url, "tiny", True]
        again = http.post("/v1/engines", json={"url": extra.url}, headers=key)
        assert [again.status_code, again.json()["error"]["field"]] == [409, "url"]
        nowhere = http.post("/v1/engines", json={"url": f"http://127.0.0.1:{free_port()}"}, headers=key)
        assert [nowhere.status_code, nowhere.json()["error"]["field"]] == [400, "url"]
        assert [e["engine_id"] for e in http.get("/v1/engines", headers=key).json()["engines"]] == ["e0", "e1"]
        # The new engine takes calls: concurrent requests (one app each) spread over both engines.
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)

        def complete(i: int) -> str:
            got = client.completions.create(model="tiny", prompt=f"Hello number {i}", max_tokens=64, temperature=0)
            return got.choices[0].text

        with ThreadPoolExecutor(4) as pool:
            assert len(list(pool.map(complete, range(4)))) == 4
        own = extra.engine.engine.stats()
        assert own.num_decode_tokens > 0
        # /v1/engines shows the engine's own counters as of its last heartbeat (every 0.5 s).
        counters = ("num_prefill_tokens", "num_decode_tokens", "num_reused_tokens", "native_kernels")
        want = [getattr(own, c) for c in counters]
        deadline = time.monotonic() + 10
        while True:
            shown = http.get("/v1/engines", headers=key).json()["engines"][1]
            if [shown[c] for c in counters] == want or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert [shown[c] for c in counters] == want


def test_chat_requests_reuse_a_cached_system_prompt(server: LiveServer) -> None:
    tok = Tokenizer(server.engine.model_folder)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
    system = {"role": "system", "content": "You are a release bot. Keep answers under ten words. " * 4}
    n_system = len(tok.encode(tok.apply_chat_template([system], add_generation_prompt=False)))
    cached = []
    for question in ("When do we ship?", "Who signs off?"):
        got = client.chat.completions.create(
            model="tiny",
            messages=[system, {"role": "user", "content": question}],  # type: ignore[list-item]
            max_tokens=3,
            temperature=0,
        )
        assert got.usage is not None and got.usage.prompt_tokens_details is not None
        cached.append(got.usage.prompt_tokens_details.cached_tokens)
    assert cached == [0, n_system - 1]


def test_registration_needs_the_launchers_connector(tiny_engine: AsyncEngine) -> None:
    """The manager builds no engine client itself: without a connector from the launcher,
    `POST /v1/engines` is refused (501, naming `url`) and the engine list is unchanged."""
    manager = create_manager([tiny_engine])
    key = {"Authorization": "Bearer k"}
    with serve_app(create_app(manager)) as (url, _), httpx.Client(base_url=url, timeout=60) as http:
        resp = http.post("/v1/engines", json={"url": "http://127.0.0.1:9"}, headers=key)
        assert [resp.status_code, resp.json()["error"]["field"]] == [501, "url"]
        assert [e["engine_id"] for e in http.get("/v1/engines", headers=key).json()["engines"]] == ["e0"]
