"""Bad input gets a clear error naming the field, changes nothing, and the engine keeps serving."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from parrot.engine import sync_client
from parrot.engine.async_engine import AsyncEngine
from parrot.engine.config import EngineConfig
from parrot.engine.llm_engine import LLMEngine
from parrot.engine.server.app import create_engine_app
from parrot.protocol import ExtendRequest, FreeContextRequest, ParrotError, SamplingParams
from parrot.web.server_thread import ServerThread


@pytest.fixture(scope="module")
def engine(tiny_model_folder: Path) -> Iterator[LLMEngine]:
    eng = LLMEngine(EngineConfig(model=str(tiny_model_folder), dtype="float32", num_blocks=64, block_size=16))
    eng.start()
    yield eng
    eng.stop()


@pytest.fixture(scope="module")
def server(engine: LLMEngine) -> Iterator[str]:
    with ServerThread(create_engine_app(AsyncEngine(engine=engine))) as srv:
        yield srv.url


def expect_error(fn: object, status: int, field: str | None) -> ParrotError:
    with pytest.raises(ParrotError) as info:
        fn()  # type: ignore[operator]
    assert info.value.status == status
    assert info.value.field == field
    return info.value


def test_in_process_errors(engine: LLMEngine) -> None:
    sync_client.extend_only(engine, ExtendRequest(context_id="base", token_ids=[5, 6, 7]))
    free_before = engine.stats().num_blocks_free
    expect_error(
        lambda: sync_client.extend_only(engine, ExtendRequest(context_id="n", token_ids=[1], parent_context_id="nope")),
        404,
        "parent_context_id",
    )
    expect_error(
        lambda: sync_client.extend_only(
            engine, ExtendRequest(context_id="base", token_ids=[1], parent_context_id="base")
        ),
        409,
        "context_id",
    )
    expect_error(lambda: engine.free(FreeContextRequest(context_id="ghost")), 404, "context_id")
    expect_error(
        lambda: sync_client.extend_only(engine, ExtendRequest(context_id="big", token_ids=[10**6])), 400, "token_ids"
    )
    # Longer than the model's context (4096 for the tiny model).
    err = expect_error(
        lambda: sync_client.extend_only(engine, ExtendRequest(context_id="long", token_ids=[3] * 5000)),
        400,
        "token_ids",
    )
    assert "4096" in err.message
    # Fits the model but not the KV pool (64 blocks of 16 = 1024 slots).
    expect_error(
        lambda: sync_client.extend_only(engine, ExtendRequest(context_id="huge", token_ids=[3] * 2000)),
        400,
        "token_ids",
    )
    expect_error(
        lambda: sync_client.extend(engine, ExtendRequest(context_id="nowhere", append=True, sampling=SamplingParams())),
        404,
        "context_id",
    )
    with pytest.raises(ValueError, match="nothing to generate from"):  # a context is never empty
        ExtendRequest(context_id="empty", sampling=SamplingParams())
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="stop"):
        SamplingParams(stop=[""])
    # Nothing leaked; the engine still serves.
    assert engine.stats().num_blocks_free == free_before
    assert "long" not in engine.contexts and "n" not in engine.contexts
    events = sync_client.extend(
        engine, ExtendRequest(context_id="base", append=True, sampling=SamplingParams(max_tokens=3))
    )
    assert events[-1].finish_reason in ("length", "eos")


def test_freeing_a_generating_context_frees_it_when_the_generation_ends(engine: LLMEngine) -> None:
    sync_client.extend_only(engine, ExtendRequest(context_id="busy", token_ids=[9] * 20))
    h = sync_client.submit(
        engine, ExtendRequest(context_id="busy", append=True, sampling=SamplingParams(max_tokens=40, ignore_eos=True))
    )
    engine.free(FreeContextRequest(context_id="busy"))  # accepted: no 409, nothing to retry
    assert len(sync_client.wait(h)) == 40  # the generation runs to its end
    assert "busy" not in engine.contexts  # freed before its last event was handed out


def test_http_api_and_malformed_bodies(server: str) -> None:
    with httpx.Client(base_url=server, timeout=60) as c:
        r = c.post("/v1/engine/extend", json={"context_id": "h1", "token_ids": [4, 5, 6, 7]})
        filled = {"num_tokens": 4, "num_filled_tokens": 3, "token_logprobs": None, "top_logprobs": None}
        assert [r.status_code, r.headers["content-type"]] == [200, "application/x-ndjson"]
        [line] = r.text.splitlines()  # an extend without sampling: one line
        assert json.loads(line) == {
            "token_id": None,
            "logprob": None,
            "text": "",
            "finish_reason": "filled",
            "error": None,
            "filled": filled,
            "output_token_ids": None,
            "top_logprobs": None,
            "choice_logprobs": None,
        }
        with c.stream(
            "POST",
            "/v1/engine/extend",
            json={"context_id": "h2", "parent_context_id": "h1", "sampling": {"max_tokens": 4, "ignore_eos": True}},
        ) as s:
            assert s.status_code == 200
            events = [json.loads(line) for line in s.iter_lines() if line]
        assert len(events) == 4 and events[-1]["finish_reason"] == "length"
        assert all(isinstance(e["token_id"], int) and e["filled"] is None for e in events)  # no tokens went in
        sampling = {"max_tokens": 2, "ignore_eos": True}
        with c.stream(
            "POST", "/v1/engine/extend", json={"context_id": "h4", "token_ids": [4, 5], "sampling": sampling}
        ) as s:
            events = [json.loads(line) for line in s.iter_lines() if line]
        assert [e["filled"] for e in events] == [{**filled, "num_tokens": 2, "num_filled_tokens": 1}, None]
        # Malformed bodies: 400 naming the field, as the manager answers (one error mapping: parrot.web.edge).
        r = c.post("/v1/engine/extend", json={"context_id": "h3", "token_ids": "abc"})
        assert r.status_code == 400 and r.json()["error"]["field"] == "token_ids"
        r = c.post("/v1/engine/extend", json={"context_id": "h1", "append": True, "sampling": {"temperature": -2}})
        assert r.status_code == 400 and r.json()["error"]["field"] == "sampling.temperature"
        r = c.post("/v1/engine/extend", json={"context_id": "h1", "append": True})  # nothing to do
        assert r.status_code == 400 and r.json()["error"]["field"] == "token_ids"
        r = c.post("/v1/engine/extend", json={"context_id": "h5", "token_ids": [4], "score": True, "sampling": {}})
        assert r.status_code == 400 and r.json()["error"]["field"] == "score"
        r = c.post("/v1/engine/extend", content=b"{not json", headers={"content-type": "application/json"})
        assert r.status_code == 400
        r = c.post("/v1/engine/extend", json={"context_id": "", "token_ids": [1]})
        assert r.status_code == 400 and r.json()["error"]["field"] == "context_id"
        r = c.post("/v1/engine/extend", json={"context_id": "h9", "parent_context_id": "missing", "sampling": {}})
        assert r.status_code == 404 and r.json()["error"]["field"] == "parent_context_id"
        r = c.post("/v1/engine/free", json={"context_id": "missing"})
        assert r.status_code == 404
        r = c.post("/v1/engine/extend", content=b"x" * (17 << 20), headers={"content-type": "application/json"})
        assert r.status_code == 413
        stats = c.get("/v1/engine/stats").json()
        assert stats["num_contexts"] >= 2 and stats["num_blocks_free"] < stats["num_blocks_total"]
        assert c.post("/v1/engine/free", json={"context_id": "h2"}).status_code == 200
        for route in ("fill", "generate"):  # one operation: no route of its own for either half
            assert c.post(f"/v1/engine/{route}", json={"context_id": "h1"}).status_code == 404
        assert c.get("/health").json() == {"status": "ok"}


def test_abort_ends_a_generation_and_frees_its_context(engine: LLMEngine) -> None:
    import asyncio

    sync_client.extend_only(engine, ExtendRequest(context_id="ab", token_ids=[11] * 10))
    free_before = engine.stats().num_blocks_free
    job_id = engine.submit_extend(
        ExtendRequest(
            context_id="ab2", parent_context_id="ab", sampling=SamplingParams(max_tokens=2000, ignore_eos=True)
        ),
        (h := sync_client.Handle()).sink,
    )
    first = h.events.get(timeout=60)
    engine.abort(job_id)
    events = [first]
    while events[-1].finish_reason is None:  # type: ignore[union-attr]
        events.append(h.events.get(timeout=60))
    assert events[-1].finish_reason == "aborted"  # type: ignore[union-attr]
    assert len(events) < 200
    engine.free(FreeContextRequest(context_id="ab2"))  # no longer busy
    assert engine.stats().num_blocks_free == free_before

    async def read_two() -> int:
        agen = AsyncEngine(engine=engine).extend(
            ExtendRequest(
                context_id="ab3", parent_context_id="ab", sampling=SamplingParams(max_tokens=2000, ignore_eos=True)
            )
        )
        n = 0
        async for _ in agen:
            n += 1
            if n == 2:
                break
        await agen.aclose()  # the reader leaves: the engine aborts the generation
        return n

    assert asyncio.run(read_two()) == 2
    deadline = time.monotonic() + 30  # the abort lands at the next step; then the free succeeds
    while engine.scheduler.busy("ab3"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    engine.free(FreeContextRequest(context_id="ab3"))
    assert engine.stats().num_blocks_free == free_before
    assert engine.stats().num_decode_tokens < 1000  # neither generation ran to max_tokens


def test_a_fill_creates_or_appends_never_both(engine: LLMEngine, server: str) -> None:
    """Creating an id that exists is a 409 (a restarted manager or a retried request never doubles
    a context); appending needs the context (404) and names no parent (400)."""
    sync_client.extend_only(engine, ExtendRequest(context_id="once", token_ids=[4, 5, 6]))
    expect_error(
        lambda: sync_client.extend_only(engine, ExtendRequest(context_id="once", token_ids=[4, 5, 6])),
        409,
        "context_id",
    )
    expect_error(
        lambda: sync_client.extend_only(engine, ExtendRequest(context_id="never", token_ids=[1], append=True)),
        404,
        "context_id",
    )
    result = sync_client.extend_only(engine, ExtendRequest(context_id="once", token_ids=[7], append=True))
    assert [result.num_tokens, engine.contexts.get("once").tokens] == [4, [4, 5, 6, 7]]
    with httpx.Client(base_url=server) as c:
        again = c.post("/v1/engine/extend", json={"context_id": "once", "token_ids": [4]})
        assert [again.status_code, again.json()["error"]["field"]] == [409, "context_id"]
        both = c.post(
            "/v1/engine/extend", json={"context_id": "x", "token_ids": [4], "parent_context_id": "once", "append": True}
        )
        assert [both.status_code, both.json()["error"]["field"]] == [400, "append"]
    engine.free(FreeContextRequest(context_id="once"))
