"""The example applications run end to end on the tiny engine (their text is noise; their shape
and completion are the point)."""

from __future__ import annotations

from live_server import LiveServer

from examples.chain_summary import chain_summary
from examples.common import chunk_words
from examples.demo import run_demo
from examples.map_reduce_summary import map_reduce_summary

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


def test_demo_runs_every_app(server: LiveServer) -> None:
    lines: list[str] = []
    results = run_demo(server.url, TEXT, print_fn=lines.append)
    assert [name for name, _, _ in results] == [
        "chain summary",
        "map-reduce summary",
        "multi-output (joke + explanation)",
        "native function in a pipeline",
    ]
    assert all(seconds > 0 for _, _, seconds in results)
    assert len(lines) == 5
    # The last line: what Parrot saved (a new manager: its totals are the demo's).
    t = server.manager.metrics.totals
    assert t["calls"] == 5, t  # this short text: one call per app, two for the native pipeline
    share = f" ({t['reused'] / t['prompt']:.0%})"
    saved = max(t["calls"] - t["gets"], 0)
    assert lines[-1] == (
        f"Parrot: {t['calls']} calls finished, {t['generated']} tokens generated; saved {saved} "
        f"client round trips ({t['gets']} fetches instead of {t['calls']} requests) and reused {t['reused']} of "
        f"{t['prompt']} prompt tokens from shared prefixes{share}"
    )
