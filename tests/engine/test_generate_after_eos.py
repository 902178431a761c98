"""A generation that ends on EOS leaves its context's last token computed (the EOS is not
appended): the next generation on that context, or on a fork of it, without a fill in between,
must still compute that token and sample, not find nothing to do and step forever (found by the
engine API fuzz test: a 20 s hang). The engine runs step by step here, bounded."""

from __future__ import annotations

from pathlib import Path

import pytest

from parrot.engine import sync_client
from parrot.engine.config import EngineConfig
from parrot.engine.llm_engine import LLMEngine
from parrot.protocol import ExtendRequest, SamplingParams

PROMPT = [11, 12, 13, 14, 15, 16, 17]
MAX_STEPS = 100  # far more than any request here needs


@pytest.fixture(scope="module")
def engine(tiny_model_folder: Path) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(tiny_model_folder), dtype="float32", num_blocks=64, block_size=4))


def run_bounded(engine: LLMEngine) -> int:
    for num_steps in range(MAX_STEPS):
        if not engine.step():
            return num_steps
    raise AssertionError(f"the engine still had work after {MAX_STEPS} steps")


def generate(engine: LLMEngine, req: ExtendRequest) -> list[int]:
    h = sync_client.submit(engine, req)
    run_bounded(engine)
    return sync_client.token_ids(sync_client.wait(h, timeout=1))


def ended_on_eos(engine: LLMEngine, context_id: str) -> None:
    """Fill `context_id` with PROMPT, then a generation whose first token is EOS (forced by bias)."""
    eos = min(engine.eos_ids)
    h = sync_client.submit(engine, ExtendRequest(context_id=context_id, token_ids=PROMPT))
    run_bounded(engine)
    sync_client.wait_filled(h, timeout=1)
    forced = SamplingParams(max_tokens=4, logit_bias={eos: 100.0})
    h = sync_client.submit(engine, ExtendRequest(context_id=context_id, append=True, sampling=forced))
    run_bounded(engine)
    events = sync_client.wait(h, timeout=1)
    assert [(e.token_id, e.finish_reason, e.output_token_ids) for e in events] == [(eos, "eos", [])]


def test_a_generate_right_after_an_eos_finish_computes_the_last_token_again(engine: LLMEngine) -> None:
    greedy = SamplingParams(max_tokens=3, ignore_eos=True)
    expected = generate(engine, ExtendRequest(context_id="fresh", token_ids=PROMPT, sampling=greedy))
    ended_on_eos(engine, "c")
    assert generate(engine, ExtendRequest(context_id="c", append=True, sampling=greedy)) == expected
    ended_on_eos(engine, "p")  # and a fork of such a context, generating at once
    assert generate(engine, ExtendRequest(context_id="f", parent_context_id="p", sampling=greedy)) == expected
