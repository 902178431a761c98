"""The SDK's call features against a real server and the tiny engine: n samples sharing one filled
prompt, lists and text holding variables as inputs, cancelling a call."""

from __future__ import annotations

import time

import httpx
import pytest
from live_server import LiveServer

from parrot.frontend import Input, Output, ParrotError, SamplingParams, Session, semantic_function
from parrot.protocol.engine_api import EngineStats
from parrot.text import Tokenizer

TINY = SamplingParams(max_tokens=3, ignore_eos=True)
PREAMBLE = (
    "You are a storyteller. Stories have a beginning, a middle and an end; they have characters with names, "
    "places with smells and sounds, and a twist near the end that nobody saw coming."
)


@semantic_function(sampling=SamplingParams(max_tokens=4, ignore_eos=True, temperature=1.0, seed=11))
def story(topic: Input, text: Output):
    """You are a storyteller. Stories have a beginning, a middle and an end; they have characters with names, places with smells and sounds, and a twist near the end that nobody saw coming. Write a story about {{input:topic}}. Story:{{output:text}}"""  # noqa: E501


@semantic_function(sampling=TINY)
def react(text: Input, reaction: Output):
    """React to {{input:text}}:{{output:reaction}}"""


@semantic_function(sampling=TINY)
def combine(items: Input, summary: Output):
    """Combine these:
    {{input:items}}
    Summary:{{output:summary}}"""


@semantic_function(sampling=SamplingParams(max_tokens=2000, ignore_eos=True))
def ramble(topic: Input, text: Output):
    """Ramble about {{input:topic}} forever:{{output:text}}"""


def settle(server: LiveServer, timeout_s: float = 10.0) -> EngineStats:
    """The engine's stats once it runs nothing and only the manager's cached prefixes remain freed."""
    deadline = time.monotonic() + timeout_s
    while True:
        server.clear_prefix_cache()
        stats = server.stats()
        if (stats.num_running == 0 and stats.num_contexts == 0) or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def test_n_samples_fork_one_filled_prompt(server: LiveServer) -> None:
    tok = Tokenizer(server.engine.model_folder)
    settle(server)
    num_prompt = len(tok.encode(f"{PREAMBLE} Write a story about a dragon. Story:"))
    with Session(server.url) as s:
        samples = story.samples(4, "a dragon")
        texts = [v.get() for v in samples]
        status = s.status()
    calls = sorted(status.calls, key=lambda c: int(c.call_id[1:]))
    # One call computed the prompt; the other three forked it and computed only the last prompt
    # token (the one whose logits they sample from).
    assert [c.num_prompt_tokens for c in calls] == [num_prompt] * 4
    assert [c.num_cached_tokens for c in calls] == [0, num_prompt - 1, num_prompt - 1, num_prompt - 1]
    assert [c.num_computed_tokens for c in calls] == [num_prompt, 1, 1, 1]
    fills = [n for _, op, ctx, n in server.engine.log if op == "fill" and ctx.startswith("pfx-")]
    assert sum(fills) == num_prompt  # the shared prefix contexts, filled once
    # Seeds 11..14: four different samples, each what the engine samples alone with its seed.
    assert len(set(texts)) == 4
    prompt = tok.encode(f"{PREAMBLE} Write a story about a dragon. Story:")
    sampling = story.sampling["text"]
    assert texts[2] == server.direct_generate(prompt, sampling.model_copy(update={"seed": 13}))


def test_lists_and_text_with_variables_render_as_their_text(server: LiveServer) -> None:
    tok = Tokenizer(server.engine.model_folder)
    with Session(server.url) as s:
        a, b = react("apples"), react("pears")
        listed = combine([a, "and {{ braces", b])
        inline = combine(["x", "y"])
        spliced = react(f"first {a}, then {b}")
        a_text, b_text = a.get(), b.get()
        expected = f"Combine these:\n1. {a_text}\n2. and {{{{ braces\n3. {b_text}\nSummary:"
        assert listed.get() == server.direct_generate(tok.encode(expected), TINY)
        assert inline.get() == server.direct_generate(tok.encode("Combine these:\n1. x\n2. y\nSummary:"), TINY)
        assert spliced.get() == server.direct_generate(tok.encode(f"React to first {a_text}, then {b_text}:"), TINY)
        consumers = [v.num_consumers for v in s.list_variables().variables if v.var_id in (a.var_id, b.var_id)]
        assert consumers == [2, 2]  # the server saw each variable as an input of two calls


def test_cancelling_a_call_stops_its_generation_and_frees_its_blocks(server: LiveServer) -> None:
    before = settle(server)
    with Session(server.url) as s:
        text = ramble("the sea")
        consumer = react(text)
        chunks = text.stream()
        assert next(chunks)  # it is generating
        text.cancel()
        with pytest.raises(ParrotError, match="was cancelled by the client") as info:
            list(chunks)
        assert info.value.status == 410
        with pytest.raises(ParrotError) as info:
            text.get()
        assert [info.value.status, info.value.field] == [410, "call_id"]
        with pytest.raises(ParrotError, match="input 'text' of call c1 failed") as info:
            consumer.get()
        assert info.value.status == 424
        after = settle(server)
        assert [after.num_running, after.num_contexts, after.num_blocks_free] == [0, 0, before.num_blocks_free]
        assert after.num_decode_tokens - before.num_decode_tokens < 1000  # stopped, not run to 2,000
        with pytest.raises(ParrotError, match="has finished") as info:
            text.cancel()
        assert [info.value.status, info.value.field] == [409, "call_id"]
        topic = s.variable("topic", "x")
        with pytest.raises(ParrotError, match="is no call's output") as info:
            topic.cancel()
        assert info.value.field == "var_id"
        status = s.status()
        assert [c.state for c in sorted(status.calls, key=lambda c: c.call_id)] == ["failed", "failed"]
        token = s.core.transport._headers["Authorization"]
        resp = httpx.delete(f"{server.url}/v1/sessions/{s.session_id}/calls/c9", headers={"Authorization": token})
        assert [resp.status_code, resp.json()["error"]["field"]] == [404, "call_id"]


def test_cancelling_a_waiting_call(server: LiveServer) -> None:
    with Session(server.url) as s:
        gate = s.variable("gate")
        waiting = react(gate)
        waiting.cancel()
        gate.set("now")
        with pytest.raises(ParrotError, match="call c0 was cancelled by the client"):
            waiting.get()
        assert [c.state for c in s.status().calls] == ["failed"]
