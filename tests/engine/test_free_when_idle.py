"""Free of a context with work in progress: accepted at once, the context goes when that
work ends, and meanwhile it takes no new work (404, as if gone). The engine runs step by step
here (`LLMEngine.step`, no loop thread), so every assertion sees an exact point of the work."""

from __future__ import annotations

from pathlib import Path

import pytest

from parrot.engine import sync_client
from parrot.engine.config import EngineConfig
from parrot.engine.llm_engine import LLMEngine
from parrot.protocol import ExtendRequest, FreeContextRequest, ParrotError, SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_model_folder: Path) -> LLMEngine:
    # Never started: the tests drive each step.
    return LLMEngine(EngineConfig(model=str(tiny_model_folder), dtype="float32", num_blocks=64, block_size=16))


def run_until_idle(engine: LLMEngine) -> int:
    num_steps = 0
    while engine.step():
        num_steps += 1
    return num_steps


def error_of(fn: object) -> list[object]:
    with pytest.raises(ParrotError) as info:
        fn()  # type: ignore[operator]
    return [info.value.status, info.value.field]


def fill(engine: LLMEngine, req: ExtendRequest) -> None:
    h = sync_client.submit(engine, req)
    run_until_idle(engine)
    sync_client.wait_filled(h, timeout=1)


def test_a_generating_context_is_freed_when_its_generation_ends(engine: LLMEngine) -> None:
    free_before = engine.stats().num_blocks_free
    fill(engine, ExtendRequest(context_id="g", token_ids=[9] * 20))
    h = sync_client.submit(
        engine, ExtendRequest(context_id="g", append=True, sampling=SamplingParams(max_tokens=5, ignore_eos=True))
    )
    assert engine.step()  # the first token
    engine.free(FreeContextRequest(context_id="g"))
    assert [engine.context_info("g").num_tokens, engine.stats().num_blocks_free] == [21, free_before - 2]
    # Being freed: no new work, no second free, as if it were gone.
    assert error_of(lambda: engine.free(FreeContextRequest(context_id="g"))) == [404, "context_id"]
    append = ExtendRequest(context_id="g", token_ids=[3], append=True)
    assert error_of(lambda: engine.submit_extend(append, lambda e: None)) == [404, "context_id"]
    fork = ExtendRequest(context_id="g2", token_ids=[3], parent_context_id="g")
    assert error_of(lambda: engine.submit_extend(fork, lambda e: None)) == [404, "parent_context_id"]
    again = ExtendRequest(context_id="g", append=True, sampling=SamplingParams())
    assert error_of(lambda: engine.submit_extend(again, lambda e: None)) == [404, "context_id"]
    assert run_until_idle(engine) == 4  # the generation still runs to its end
    events = sync_client.wait(h, timeout=1)
    assert [len(events), events[-1].finish_reason] == [5, "length"]
    assert ["g" in engine.contexts, engine.stats().num_blocks_free] == [False, free_before]


def test_a_parent_is_freed_once_its_queued_fork_has_read_it(engine: LLMEngine) -> None:
    free_before = engine.stats().num_blocks_free
    fill(engine, ExtendRequest(context_id="p", token_ids=list(range(10, 42))))  # 32 tokens: 2 blocks
    h = sync_client.submit(engine, ExtendRequest(context_id="c", token_ids=[7, 8], parent_context_id="p"))
    engine.free(FreeContextRequest(context_id="p"))  # the queued fork still reads it
    assert "p" in engine.contexts
    assert run_until_idle(engine) == 1
    assert sync_client.wait_filled(h, timeout=1).num_tokens == 34
    info = engine.context_info("c")
    assert ["p" in engine.contexts, info.num_tokens, info.parent_context_id] == [False, 34, "p"]
    engine.free(FreeContextRequest(context_id="c"))  # idle: freed at once
    assert ["c" in engine.contexts, engine.stats().num_blocks_free] == [False, free_before]


def test_an_aborted_generation_frees_its_context_at_the_next_step(engine: LLMEngine) -> None:
    fill(engine, ExtendRequest(context_id="a", token_ids=[5] * 8))
    h = sync_client.submit(
        engine, ExtendRequest(context_id="a", append=True, sampling=SamplingParams(max_tokens=50, ignore_eos=True))
    )
    job_id = next(j.job_id for j in engine.scheduler.waiting if j.context_id == "a")
    assert engine.step() and engine.step()
    engine.free(FreeContextRequest(context_id="a"))
    engine.abort(job_id)
    assert run_until_idle(engine) == 0  # the abort ends it before any further step
    events = sync_client.wait(h, timeout=1)
    assert [len(events), events[-1].finish_reason, "a" in engine.contexts] == [3, "aborted", False]
