"""Shared-prefix attention end to end: engines with the shared-prefix backend generate the same
tokens and logprobs as the per-context backend on forked contexts (a tiny model, and the real one)."""

from __future__ import annotations

import queue
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from parrot.engine.attention.shared_prefix_backend import SharedPrefixAttention
from parrot.engine.config import EngineConfig
from parrot.engine.llm_engine import LLMEngine
from parrot.protocol.engine_api import ExtendRequest, TokenEvent
from parrot.protocol.errors import ParrotError
from parrot.protocol.sampling import SamplingParams


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 40000) for _ in range(n)]


def submit(engine: LLMEngine, req: ExtendRequest) -> queue.Queue:
    events: queue.Queue = queue.Queue()
    engine.submit_extend(req, events.put)
    return events


def drain(events: queue.Queue) -> list[tuple[int, float]]:
    """A fill's or a generation's events -> [(token id, logprob)] (empty for a fill)."""
    tokens = []
    while True:
        ev = events.get(timeout=300)
        if isinstance(ev, ParrotError):
            raise ev
        assert isinstance(ev, TokenEvent)
        if ev.finish_reason == "filled":
            return tokens
        assert ev.token_id is not None and ev.logprob is not None
        tokens.append((ev.token_id, ev.logprob))
        if ev.finish_reason is not None:
            return tokens


def generate_forks(
    engine: LLMEngine, prefix: list[int], docs: list[list[int]], turns: list[list[int]], max_tokens: int
) -> list[list[tuple[int, float]]]:
    """A system prompt, documents forked from it, turns forked from each; all turns decode together."""
    drain(submit(engine, ExtendRequest(context_id="sys", token_ids=prefix)))
    for d, doc in enumerate(docs):
        drain(submit(engine, ExtendRequest(context_id=f"doc{d}", token_ids=doc, parent_context_id="sys")))
    parents = [f"doc{d}" for d in range(len(docs))] + ["sys"]
    leaves = []
    for i, turn in enumerate(turns):
        leaves.append(f"turn{i}")
        req = ExtendRequest(context_id=leaves[-1], token_ids=turn, parent_context_id=parents[i % len(parents)])
        drain(submit(engine, req))
    sampling = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    handles = [submit(engine, ExtendRequest(context_id=c, append=True, sampling=sampling)) for c in leaves]
    return [drain(h) for h in handles]


def assert_same_generations(got: list, expected: list) -> None:
    """Same greedy tokens, and logprobs equal to fp32 rounding (a wrong attention moves them)."""
    assert [[t for t, _ in g] for g in got] == [[t for t, _ in g] for g in expected]
    torch.testing.assert_close(torch.tensor(got)[..., 1], torch.tensor(expected)[..., 1], atol=1e-4, rtol=0)


def run_engine(folder: Path, attention: str, block_size: int, dtype: str = "float32", **kw: object) -> tuple:
    import parrot.engine.attention.shared_prefix_backend  # noqa: F401  (registers "shared_prefix")

    engine = LLMEngine(
        EngineConfig(
            model=str(folder), dtype=dtype, attention=attention, block_size=block_size, num_blocks=4096 // block_size
        )
    )
    engine.start()
    try:
        return generate_forks(engine, **kw), engine.runner.backend  # type: ignore[arg-type]
    finally:
        engine.stop()


@pytest.mark.parametrize("block_size", [1, 16])
def test_engine_tokens_equal_per_context(tiny_model_folder: Path, block_size: int) -> None:
    # 7 turns under a 600-token system prompt: a group for the native kernels' grouping (4 x 512) too
    kw = {
        "prefix": prompt(0, 600),
        "docs": [prompt(1, 280), prompt(2, 300)],
        "turns": [prompt(10 + i, 3 + 5 * i) for i in range(7)],
        "max_tokens": 8,
    }
    paged, _ = run_engine(tiny_model_folder, "paged", block_size, **kw)
    shared, backend = run_engine(tiny_model_folder, "shared_prefix", block_size, **kw)
    assert isinstance(backend, SharedPrefixAttention) and backend.num_shared_steps > 0
    assert_same_generations(shared, paged)
    assert all(len(t) == 8 for t in shared)


@pytest.mark.slow
def test_real_model_forked_batch_same_greedy_tokens(default_model_folder: Path) -> None:
    from parrot.text.tokenizer import Tokenizer

    tok = Tokenizer(default_model_folder)
    system = (
        "You are a careful assistant for a public library. Answer in one short sentence, name the source "
        "when you know it, and say so plainly when you do not know. "
    ) * 16
    questions = [
        "What is the capital of France?",
        "Who wrote Hamlet?",
        "How many legs does a spider have?",
        "What is the boiling point of water?",
        "Name a primary colour.",
        "What is 12 times 12?",
    ]
    kw = {
        "prefix": tok.encode(system),
        "docs": [],
        "turns": [tok.encode(" Question: " + q) for q in questions],
        "max_tokens": 16,
    }
    assert len(kw["prefix"]) >= 512  # 6 rows x 512+ shared tokens: grouped by any backend's grouping
    paged, _ = run_engine(default_model_folder, "paged", 16, **kw)
    shared, backend = run_engine(default_model_folder, "shared_prefix", 16, **kw)
    assert isinstance(backend, SharedPrefixAttention) and backend.num_shared_steps > 0
    assert_same_generations(shared, paged)
    assert np.unique([t[0][0] for t in shared]).size > 1  # the questions differ, so do the answers
