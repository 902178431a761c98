"""The engine reads GenerateRequest.watched: a latency-critical generation someone streams caps
the step at `latency_max_batched_tokens`; one read whole leaves prefill-sized steps to the prompts
beside it (scheduler rules: test_scheduler_budget.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from parrot.engine import sync_client
from parrot.engine.config import EngineConfig
from parrot.engine.llm_engine import LLMEngine
from parrot.protocol import FillRequest, GenerateRequest
from parrot.protocol.sampling import SamplingParams
from tests.engine.test_engine_correctness import prompt


@pytest.mark.parametrize(("watched", "prompt_tokens_a_step"), [(True, 7), (False, 31)])
def test_a_decode_caps_the_prompt_beside_it_only_when_watched(
    tiny_model_folder: Path, watched: bool, prompt_tokens_a_step: int
) -> None:
    config = EngineConfig(model=str(tiny_model_folder), dtype="float32", latency_max_batched_tokens=8,
                          latency_prefill_tokens=32)  # fmt: skip
    engine = LLMEngine(config)  # no loop thread: steps run here, one at a time
    sync_client.submit_fill(engine, FillRequest(context_id="d", token_ids=prompt(1, 8)))
    while engine.step():
        pass
    sampling = SamplingParams(max_tokens=20, ignore_eos=True)
    sync_client.submit_generate(engine, GenerateRequest(context_id="d", sampling=sampling, watched=watched))
    sync_client.submit_fill(engine, FillRequest(context_id="p", token_ids=prompt(2, 100)))
    engine.step()  # "d" samples its first token beside the prompt's first chunk
    before = engine.stats()
    engine.step()
    after = engine.stats()
    # "d" decodes one token; the prompt takes what is left of the cap (8) or of the prefill-sized step (32)
    assert [
        after.num_decode_tokens - before.num_decode_tokens,
        after.num_prefill_tokens - before.num_prefill_tokens,
    ] == [
        1,
        prompt_tokens_a_step,
    ]
