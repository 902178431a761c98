"""A 3-level DAG (map, reduce, final rewrite) submitted in one go runs on the real engine with no
client involvement between levels; each call's tokens are the tokenizer's for its rendered prompt."""

from __future__ import annotations

import time

from live_server import LiveServer

from parrot.frontend import Input, Output, SamplingParams, Session, semantic_function
from parrot.serve.runtime.call_run import CallState
from parrot.text import Tokenizer

SMALL = SamplingParams(max_tokens=4, ignore_eos=True)


@semantic_function(sampling=SMALL)
def summarize(chunk: Input, summary: Output):
    """Summarize this part: {{input:chunk}}
    Summary:{{output:summary}}"""


@semantic_function(sampling=SMALL)
def combine(a: Input, b: Input, c: Input, d: Input, summary: Output):
    """Combine {{input:a}} / {{input:b}} / {{input:c}} / {{input:d}} into one summary:{{output:summary}}"""


@semantic_function(sampling=SMALL)
def rewrite(text: Input, final: Output):
    """Rewrite for a child: {{input:text}} Child version:{{output:final}}"""


def test_three_level_dag_runs_without_the_client(server: LiveServer) -> None:
    chunks = ["The first part.", "The second part.", "The third part.", "The fourth part."]
    blocks_free_before = server.stats().num_blocks_free
    with Session(server.url, api_key="k") as s:
        maps = [summarize(c) for c in chunks]
        reduced = combine(*maps)
        final = rewrite(reduced)
        s.flush()  # everything has reached the server; from here on the client only waits

        session = server.manager.sessions.sessions[s.session_id]
        deadline = time.monotonic() + 60
        while any(r.state is not CallState.DONE for r in session.runs.values()):
            assert time.monotonic() < deadline, "the DAG did not finish on its own"
            time.sleep(0.01)
        first_get_at = time.monotonic()
        final_text = final.get()

        calls = session.runs
        assert sorted(calls) == ["c0", "c1", "c2", "c3", "c4", "c5"]
        assert [calls[c].call.name for c in sorted(calls)] == ["summarize"] * 4 + ["combine", "rewrite"]
        # Every level started (and finished) before the client asked for anything.
        assert all(c.dispatched_at is not None and c.dispatched_at < first_get_at for c in calls.values())
        # Each level was released by its producers: reduce after the last map, rewrite after reduce.
        assert calls["c4"].dispatched_at >= max(calls[f"c{i}"].finished_at for i in range(4))  # type: ignore[type-var]
        assert calls["c5"].dispatched_at >= calls["c4"].finished_at  # type: ignore[operator]
        # Pipelining: the rewrite's constant prefix was filled before the reduce finished generating.
        log = server.engine
        assert log.first("fill", ".c5") < log.first("generated", ".c4")

        # The values are exactly what the engine produces for the rendered prompts' token ids.
        tok = Tokenizer(server.engine.model_folder)
        map_values = [m.get() for m in maps]
        expected_map0 = server.direct_generate(tok.encode(f"Summarize this part: {chunks[0]}\nSummary:"), SMALL)
        assert map_values[0] == expected_map0
        reduce_ids = tok.encode(f"Combine {' / '.join(map_values)} into one summary:")
        assert reduced.get() == server.direct_generate(reduce_ids, SMALL)
        rewrite_ids = tok.encode(f"Rewrite for a child: {reduced.get()} Child version:")
        assert final_text == server.direct_generate(rewrite_ids, SMALL)
        assert [calls[c].num_generated_tokens for c in sorted(calls)] == [4] * 6
    # Leaving the session deleted it; every context of its calls is back in the pool.
    assert server.wait_blocks_free(blocks_free_before).num_blocks_free == blocks_free_before
