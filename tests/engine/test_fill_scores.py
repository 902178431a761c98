"""A scoring fill (an Extend with ExtendRequest.score) reports each filled token's log-probability given everything
before it: the logprob the sampler gives that token when it generates it, the same whether the
tokens come as a fork of a filled prompt or in one fill, whatever the chunking (float32 tiny model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from parrot.engine import sync_client
from parrot.engine.config import EngineConfig
from parrot.engine.llm_engine import LLMEngine
from parrot.protocol import ExtendRequest, Filled, SamplingParams

PROMPT = [5, 17, 42, 9, 300, 12]
OPTION = [77, 8, 1000]


def make_engine(folder: Path, **kw: object) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(folder), dtype="float32", num_blocks=64, block_size=16, **kw))  # type: ignore[arg-type]


def fill(engine: LLMEngine, req: ExtendRequest) -> Filled:
    handle = sync_client.submit(engine, req)
    while engine.step():
        pass
    return sync_client.wait_filled(handle, timeout=5)


@pytest.mark.parametrize("max_num_batched_tokens", [2048, 4])  # one step; chunks of 4 tokens
def test_a_fork_scores_its_tokens_given_the_prompt(tiny_model_folder: Path, max_num_batched_tokens: int) -> None:
    engine = make_engine(tiny_model_folder, max_num_batched_tokens=max_num_batched_tokens)
    fill(engine, ExtendRequest(context_id="p", token_ids=PROMPT))
    forked = fill(engine, ExtendRequest(context_id="o", parent_context_id="p", token_ids=OPTION, score=True))
    whole = fill(engine, ExtendRequest(context_id="w", token_ids=PROMPT + OPTION, score=True))
    assert forked.token_logprobs is not None and whole.token_logprobs is not None
    assert [len(forked.token_logprobs), whole.token_logprobs[0]] == [3, None]  # nothing precedes a first token
    assert forked.token_logprobs == pytest.approx(whole.token_logprobs[len(PROMPT) :], abs=1e-5)
    assert all(x is not None and x < 0 for x in whole.token_logprobs[1:])


def test_an_unscored_fill_reports_no_logprobs(tiny_model_folder: Path) -> None:
    engine = make_engine(tiny_model_folder)
    assert fill(engine, ExtendRequest(context_id="p", token_ids=PROMPT)).token_logprobs is None


def test_a_score_is_the_logprob_the_sampler_gives_the_same_token(tiny_model_folder: Path) -> None:
    engine = make_engine(tiny_model_folder)
    fill(engine, ExtendRequest(context_id="p", token_ids=PROMPT))
    greedy = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    handle = sync_client.submit(engine, ExtendRequest(context_id="g", parent_context_id="p", sampling=greedy))
    while engine.step():
        pass
    (event,) = [e for e in sync_client.wait(handle, timeout=5) if e.token_id is not None]
    scored = fill(engine, ExtendRequest(context_id="s", parent_context_id="p", token_ids=[event.token_id], score=True))
    assert scored.token_logprobs == pytest.approx([event.logprob], abs=1e-5)


def test_alternatives_are_the_most_likely_tokens_the_sampler_reports(tiny_model_folder: Path) -> None:
    engine = make_engine(tiny_model_folder)
    fill(engine, ExtendRequest(context_id="p", token_ids=PROMPT))
    greedy = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, top_logprobs=3)
    handle = sync_client.submit(engine, ExtendRequest(context_id="g", parent_context_id="p", sampling=greedy))
    while engine.step():
        pass
    (event,) = [e for e in sync_client.wait(handle, timeout=5) if e.token_id is not None]
    assert event.top_logprobs is not None
    req = ExtendRequest(context_id="s", token_ids=[*PROMPT, event.token_id], score=True, top_logprobs=3)
    scored = fill(engine, req)
    assert scored.top_logprobs is not None and scored.token_logprobs is not None
    assert [len(scored.top_logprobs), scored.top_logprobs[0]] == [len(PROMPT) + 1, None]
    last = scored.top_logprobs[-1]
    assert last is not None
    # The generated token's position: the same alternatives, in the same order, as the sampler's.
    assert [t.token_id for t in last] == [t.token_id for t in event.top_logprobs]
    assert [t.logprob for t in last] == pytest.approx([t.logprob for t in event.top_logprobs], abs=1e-5)
    for logprob, top in zip(scored.token_logprobs[1:], scored.top_logprobs[1:], strict=True):
        assert top is not None and len(top) == 3 and logprob is not None and logprob <= top[0].logprob + 1e-6
    # Without top_logprobs, none are reported.
    assert fill(engine, ExtendRequest(context_id="t", token_ids=PROMPT, score=True)).top_logprobs is None
