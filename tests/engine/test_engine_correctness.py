"""The engine on a tiny random LLaMA (fp32): forks, batching and chunking never change tokens."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from parrot.engine import sync_client
from parrot.engine.config import EngineConfig
from parrot.engine.llm_engine import LLMEngine
from parrot.protocol import ExtendRequest, FreeContextRequest, SamplingParams

GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


def make_engine(folder: Path, **kw: object) -> LLMEngine:
    engine = LLMEngine(EngineConfig(model=str(folder), dtype="float32", **kw))  # type: ignore[arg-type]
    engine.start()
    return engine


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 40000) for _ in range(n)]


def gen(engine: LLMEngine, ctx: str, sampling: SamplingParams = GREEDY, parent: str | None = None) -> list[int]:
    req = ExtendRequest(context_id=ctx, parent_context_id=parent, append=parent is None, sampling=sampling)
    return sync_client.token_ids(sync_client.extend(engine, req))


@pytest.mark.parametrize("block_size", [1, 16])
def test_fork_then_suffix_equals_one_fill(tiny_model_folder: Path, block_size: int) -> None:
    engine = make_engine(tiny_model_folder, block_size=block_size, num_blocks=4096)
    try:
        start_free = engine.stats().num_blocks_free
        prefix, suffix = prompt(1, 37), prompt(2, 11)  # 37 is not a multiple of 16
        sync_client.extend_only(engine, ExtendRequest(context_id="whole", token_ids=prefix + suffix))
        expected = gen(engine, "whole")
        sync_client.extend_only(engine, ExtendRequest(context_id="prefix", token_ids=prefix))
        for i in range(3):  # several children of one parent, and a grandchild
            sync_client.extend_only(
                engine, ExtendRequest(context_id=f"child{i}", token_ids=suffix, parent_context_id="prefix")
            )
            assert gen(engine, f"child{i}") == expected
        sync_client.extend_only(
            engine, ExtendRequest(context_id="mid", token_ids=suffix[:5], parent_context_id="prefix")
        )
        sync_client.extend_only(engine, ExtendRequest(context_id="leaf", token_ids=suffix[5:], parent_context_id="mid"))
        assert gen(engine, "leaf") == expected
        # Generate straight into a fork of a filled context (no tokens of its own).
        sync_client.extend_only(engine, ExtendRequest(context_id="full", token_ids=prefix + suffix))
        assert gen(engine, "g", parent="full") == expected
        assert gen(engine, "g2", parent="full") == expected
        for cid in ["whole", "prefix", "child0", "child1", "child2", "mid", "leaf", "full", "g", "g2"]:
            engine.free(FreeContextRequest(context_id=cid))
        assert engine.stats().num_blocks_free == start_free
        assert engine.stats().num_contexts == 0
    finally:
        engine.stop()


def test_ragged_batch_equals_each_alone(tiny_model_folder: Path) -> None:
    # A small step budget forces chunked prefill mixed with other contexts' decodes.
    engine = make_engine(tiny_model_folder, block_size=16, max_num_batched_tokens=64)
    try:
        prompts = [prompt(10 + i, n) for i, n in enumerate([5, 130, 33, 1, 77, 16])]
        alone = []
        for i, p in enumerate(prompts):
            sync_client.extend_only(engine, ExtendRequest(context_id=f"a{i}", token_ids=p))
            alone.append(gen(engine, f"a{i}"))
        fills = [
            sync_client.submit(engine, ExtendRequest(context_id=f"b{i}", token_ids=p)) for i, p in enumerate(prompts)
        ]
        gens = [
            sync_client.submit(engine, ExtendRequest(context_id=f"b{i}", append=True, sampling=GREEDY))
            for i in range(len(prompts))
        ]
        for h in fills:
            sync_client.wait_filled(h)
        together = [sync_client.token_ids(sync_client.wait(h)) for h in gens]
        assert together == alone
        stats = engine.stats()
        assert stats.num_steps > 0
        # The online capacity profile: power-of-two buckets, never above the step budget (64).
        assert stats.step_ms_by_num_tokens
        assert all(k & (k - 1) == 0 and k <= 64 and ms > 0 for k, ms in stats.step_ms_by_num_tokens.items())
    finally:
        engine.stop()


def test_preemption_under_a_small_pool_keeps_outputs(tiny_model_folder: Path) -> None:
    # 4 contexts of ~40 tokens + 12 new each need ~16 blocks of 16; give 9: some must be preempted.
    engine = make_engine(tiny_model_folder, block_size=8, num_blocks=20)
    try:
        prompts = [prompt(30 + i, 40) for i in range(4)]
        alone = []
        for i, p in enumerate(prompts):
            sync_client.extend_only(engine, ExtendRequest(context_id=f"a{i}", token_ids=p))
            alone.append(gen(engine, f"a{i}"))
            engine.free(FreeContextRequest(context_id=f"a{i}"))
        handles = []
        for i, p in enumerate(prompts):
            sync_client.submit(engine, ExtendRequest(context_id=f"b{i}", token_ids=p))
            handles.append(sync_client.submit(engine, ExtendRequest(context_id=f"b{i}", append=True, sampling=GREEDY)))
        assert [sync_client.token_ids(sync_client.wait(h)) for h in handles] == alone
    finally:
        engine.stop()


def test_seeded_sampling_is_reproducible_across_batches(tiny_model_folder: Path) -> None:
    engine = make_engine(tiny_model_folder)
    try:
        p = prompt(5, 20)
        params = SamplingParams(max_tokens=10, temperature=0.8, top_k=50, top_p=0.9, seed=1234, ignore_eos=True)
        sync_client.extend_only(engine, ExtendRequest(context_id="s", token_ids=p))
        first = gen(engine, "s1", params, parent="s")
        # Same seed while batched with other sampled work: same tokens.
        others = [
            sync_client.submit(
                engine,
                ExtendRequest(
                    context_id=f"o{i}", parent_context_id="s", sampling=params.model_copy(update={"seed": i})
                ),
            )
            for i in range(3)
        ]
        again = gen(engine, "s2", params, parent="s")
        for h in others:
            sync_client.wait(h)
        assert again == first
        assert len(first) == 10
    finally:
        engine.stop()


def test_stop_strings_tokens_and_logprobs(tiny_model_folder: Path) -> None:
    engine = make_engine(tiny_model_folder)
    try:
        p = prompt(7, 9)
        sync_client.extend_only(engine, ExtendRequest(context_id="x", token_ids=p))
        free_run = sync_client.extend(engine, ExtendRequest(context_id="y", parent_context_id="x", sampling=GREEDY))
        ids = sync_client.token_ids(free_run)
        assert all(e.logprob is not None and e.logprob <= 0.0 for e in free_run)
        # Stop at the third generated token id (included, finish "stop").
        stop_tok = SamplingParams(max_tokens=12, ignore_eos=True, stop_token_ids=[ids[2]])
        first_hit = ids.index(ids[2]) + 1
        events = sync_client.extend(engine, ExtendRequest(context_id="z", parent_context_id="x", sampling=stop_tok))
        assert sync_client.token_ids(events) == ids[:first_hit]
        assert events[-1].finish_reason == "stop"
        # A stop string made of the text of tokens 3..4: the output text ends before it.
        text = "".join(e.text for e in free_run)
        stop = engine.tokenizer.decode(ids[3:5])
        if stop and stop in text:
            sp = SamplingParams(max_tokens=12, ignore_eos=True, stop=[stop])
            ev = sync_client.extend(engine, ExtendRequest(context_id="w", parent_context_id="x", sampling=sp))
            assert "".join(e.text for e in ev) == text[: text.index(stop)]
            assert ev[-1].finish_reason == "stop"
        assert free_run[-1].finish_reason == "length"
    finally:
        engine.stop()


def test_fill_hands_its_last_token_to_the_generate_queued_behind_it(tiny_model_folder: Path) -> None:
    """A fill and a generation submitted together take one step fewer and give the same tokens."""
    engine = make_engine(tiny_model_folder, block_size=16)
    try:
        p = prompt(7, 40)
        steps0 = engine.stats().num_steps
        sync_client.extend_only(engine, ExtendRequest(context_id="apart", token_ids=p))
        apart = gen(engine, "apart")
        steps_apart = engine.stats().num_steps - steps0

        before = engine.stats()
        steps0 = before.num_steps
        fill = sync_client.submit(engine, ExtendRequest(context_id="together", token_ids=p))
        generate = sync_client.submit(engine, ExtendRequest(context_id="together", append=True, sampling=GREEDY))
        result = sync_client.wait_filled(fill)
        together = sync_client.token_ids(sync_client.wait(generate))
        assert together == apart
        after = engine.stats()
        assert after.num_steps - steps0 == steps_apart - 1
        # All 40 prompt tokens computed as prefill; the 40th's step also sampled the first output token.
        assert after.num_prefill_tokens - before.num_prefill_tokens == 40
        assert after.num_decode_tokens - before.num_decode_tokens == GREEDY.max_tokens
        # The fill's result describes the fill alone, not the token generated in its last step.
        assert [result.num_tokens, result.num_filled_tokens] == [40, 39]

        # A one-token generation ends in the fill's step.
        steps0 = engine.stats().num_steps
        sync_client.submit(engine, ExtendRequest(context_id="one", token_ids=p))
        one = SamplingParams(max_tokens=1, ignore_eos=True)
        events = sync_client.wait(
            sync_client.submit(engine, ExtendRequest(context_id="one", append=True, sampling=one))
        )
        assert [e.token_id for e in events] == apart[:1] and events[-1].finish_reason == "length"
        assert engine.stats().num_steps - steps0 == 1
        assert engine.context_info("one").num_tokens == 41
        for cid in ["apart", "together", "one"]:
            engine.free(FreeContextRequest(context_id=cid))
        assert engine.stats().num_contexts == 0
    finally:
        engine.stop()


def test_step_trace_records_each_step_by_kind(tiny_model_folder: Path) -> None:
    engine = make_engine(tiny_model_folder, block_size=16, max_num_batched_tokens=64)
    try:
        sync_client.extend_only(engine, ExtendRequest(context_id="warm", token_ids=prompt(1, 10)))
        engine.start_trace()
        # 100 prompt tokens in steps of <= 64, then 5 generated tokens: the fill's last chunk
        # samples the first (a hand-over), 4 decode steps follow. Both are queued before the
        # loop runs again, so the hand-over is certain.
        engine.stop()
        sync_client.submit(engine, ExtendRequest(context_id="t", token_ids=prompt(2, 100)))
        sampling = SamplingParams(max_tokens=5, ignore_eos=True)
        handle = sync_client.submit(engine, ExtendRequest(context_id="t", append=True, sampling=sampling))
        engine.start()
        sync_client.wait(handle)
        trace = engine.stop_trace()
        kinds = [(r.num_decode, r.num_prefill_tokens) for r in trace]
        assert kinds == [(0, 64), (0, 36), (1, 0), (1, 0), (1, 0), (1, 0)]
        assert all(r.elapsed_s > 0 and r.num_seqs == 1 for r in trace)
        assert [r.started for r in trace] == sorted(r.started for r in trace)
        sync_client.extend_only(engine, ExtendRequest(context_id="after", token_ids=prompt(3, 10)))
        assert engine.stop_trace() == []  # stopped: nothing more is recorded
    finally:
        engine.stop()


def test_a_trace_inside_a_profilers_trace_leaves_it_whole(tiny_model_folder: Path) -> None:
    """benchmarks.apps traces each builtin run for its step kinds; benchmarks.apps.step_profile traces
    the same runs around it: the inner start/stop must neither reset nor end the outer trace."""
    from benchmarks.apps import step_kinds

    engine = make_engine(tiny_model_folder, block_size=16, max_num_batched_tokens=64)
    server = type("Server", (), {"engine": type("Async", (), {"engine": engine})()})()
    try:
        assert engine.start_trace()  # the profiler's
        sync_client.extend_only(engine, ExtendRequest(context_id="a", token_ids=prompt(1, 10)))
        inner = step_kinds.start(server)
        assert inner == (engine, 1)  # a trace was on, with one step: kept
        sync_client.extend_only(engine, ExtendRequest(context_id="b", token_ids=prompt(2, 100)))
        assert step_kinds.stop(inner)["prefill"]["steps"] == 2  # its own steps only
        assert [r.num_prefill_tokens for r in engine.stop_trace()] == [9, 64, 35]  # the outer trace, whole
        inner = step_kinds.start(server)  # no trace on: its own, ended by stop
        assert inner == (engine, -1)
        sync_client.extend_only(engine, ExtendRequest(context_id="c", token_ids=prompt(3, 10)))
        assert step_kinds.stop(inner)["prefill"]["steps"] == 1 and engine.stop_trace() == []
    finally:
        engine.stop()
