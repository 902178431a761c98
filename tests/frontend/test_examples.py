"""The example applications and the demo run end to end on the tiny engine (their text is noise;
their shape, completion and the demo's measured figures are the point)."""

from __future__ import annotations

import logging

import pytest
from live_server import LiveServer

from examples.chain_summary import chain_summary
from examples.common import chunk_words
from examples.demo import run_demo
from examples.map_reduce_summary import map_reduce_summary
from examples.multi_output import tell_joke
from examples.native_pipeline import titled
from examples.savings import Phase, summary_lines

TEXT = " ".join(f"word{i}" for i in range(50))


def num_generations(server: LiveServer) -> int:
    return sum(1 for _, op, _, _ in server.engine.log if op == "generate")


def test_chunking() -> None:
    assert chunk_words("a b c d e", 2) == ["a b", "c d", "e"]


def test_chain_summary_runs_one_call_per_chunk(server: LiveServer) -> None:
    result = chain_summary(TEXT, server.url, chunk_len=10)
    assert isinstance(result, str) and result
    assert num_generations(server) == 5


def test_map_reduce_summary_combines_in_rounds(server: LiveServer) -> None:
    result = map_reduce_summary(TEXT, server.url, chunk_len=10, fan_in=2)
    assert isinstance(result, str) and result
    # 5 maps; rounds of combines over 2: 5 -> 3 (2 calls) -> 2 (1 call) -> 1 (1 call).
    assert num_generations(server) == 5 + 2 + 1 + 1


def test_the_demo_measures_what_parrot_saved(server: LiveServer, caplog: pytest.LogCaptureFixture) -> None:
    """The demo's apps through Parrot sessions, then the same calls one request at a time, on the
    tiny engine (float32: batching does not change its greedy output). Every figure of the summary
    is the manager's counters, which the request log's per-call lines add up to."""
    caplog.set_level(logging.INFO, logger="parrot.serve.calls")
    document = " ".join(f"word{i}" for i in range(300))  # 3 chunks of 110 words
    lines: list[str] = []
    prefilled = server.stats().num_prefill_tokens
    demo = run_demo(server.url, document, print_fn=lines.append)
    prefilled = server.stats().num_prefill_tokens - prefilled

    assert [(a.name, a.num_calls) for a in demo.apps] == [
        ("questions over one document", 4),
        ("map-reduce summary", 4),  # 3 maps, 1 combine
        ("chain summary", 3),
    ]
    assert [a.result == a.request_level_result for a in demo.apps] == [True, True, True]
    parrot, request_level = demo.parrot, demo.request_level
    assert parrot.num_calls == request_level.num_calls == 11
    assert parrot.num_reused_tokens > 0
    assert parrot.num_gets == 4 + 1 + 1  # every answer; the combined summary; the chain's last link
    assert parrot.num_round_trips_avoided == 5
    assert request_level.num_gets == 0

    # The counters, call by call: the request log's lines (semantic calls, then the plain requests).
    calls = [r.getMessage() for r in caplog.records if r.name == "parrot.serve.calls"]
    fields = [dict(kv.split("=", 1) for kv in line.split()[2:]) for line in calls]
    for phase, mine in ((parrot, [f for f in fields if f["name"] != "openai"]), (request_level, fields[11:])):
        assert len(mine) == phase.num_calls
        assert sum(int(f["reused"]) for f in mine) == phase.num_reused_tokens
        assert sum(int(f["prompt_tokens"]) for f in mine) == phase.num_prompt_tokens
        assert sum(int(f["output_tokens"]) for f in mine) == phase.num_generated_tokens
    assert [f["name"] for f in fields[11:]] == ["openai"] * 11
    # The engine's own count: it computed exactly the prompt tokens the manager did not count as reused.
    computed = [p.num_prompt_tokens - p.num_reused_tokens for p in (parrot, request_level)]
    assert prefilled == sum(computed)
    totals = server.manager.metrics.totals  # a new manager: its totals are the demo's
    assert totals["calls"] == 22 and totals["gets"] == parrot.num_gets
    assert totals["reused"] == parrot.num_reused_tokens + request_level.num_reused_tokens

    # What it prints: each app's result, then the summary, its figures those above.
    assert demo.lines == summary_lines(parrot, request_level, 3, 3)
    assert lines[-len(demo.lines) :] == demo.lines
    assert f"{parrot.num_reused_tokens:,} of {parrot.num_prompt_tokens:,}" in demo.lines[1]
    assert demo.lines[2].startswith("  client round trips avoided: 5 (6 variable gets for 11 calls;")


def test_the_summary_states_the_phase_figures() -> None:
    parrot = Phase(
        num_calls=11, num_prompt_tokens=2952, num_reused_tokens=1355, num_generated_tokens=426, num_gets=6, seconds=3.0
    )
    request_level = Phase(11, 2952, 766, 426, 0, 4.5)
    assert summary_lines(parrot, request_level, 2, 3) == [
        "What Parrot saved in this run (the manager's counters, GET /v1/status):",
        "  prompt tokens reused from shared prefixes: 1,355 of 2,952 (46%), computed once and forked",
        "  client round trips avoided: 5 (6 variable gets for 11 calls; intermediate values never left the manager)",
        "  time: 3.0 s for the 3 apps; the same 11 calls sent one request at a time (POST /v1/chat/completions, "
        "each awaited): 4.5 s (1.50x)",
        "  the request-level run reused 766 of 2,952 prompt tokens through the same prefix cache (chat-message and "
        "token-block boundaries)",
        "  same final text in both runs: 2 of 3 apps (greedy)",
    ]


def test_the_multi_output_and_native_pipeline_examples_run(server: LiveServer) -> None:
    joke, explanation = tell_joke("parrots", server.url)
    assert isinstance(joke, str) and isinstance(explanation, str)
    title = titled(TEXT, server.url)
    assert "(key terms: " in title
    # One chat-form call with two outputs; then summarize -> (native key terms) -> write_title.
    assert num_generations(server) == 2 + 2
