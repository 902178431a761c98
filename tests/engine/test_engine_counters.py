"""The engine's own token counters (EngineStats): prefilled, decoded and reused, exactly."""

from __future__ import annotations

import random
from pathlib import Path

from parrot.engine import sync_client
from parrot.engine.config import EngineConfig
from parrot.engine.llm_engine import LLMEngine
from parrot.protocol import ExtendRequest, SamplingParams


def test_prefill_decode_and_reuse_counters(tiny_model_folder: Path) -> None:
    engine = LLMEngine(EngineConfig(model=str(tiny_model_folder), dtype="float32", block_size=16, num_blocks=512))
    engine.start()
    rng = random.Random(7)
    try:
        prefix = [rng.randrange(3, 40000) for _ in range(40)]
        suffix = [rng.randrange(3, 40000) for _ in range(10)]
        sync_client.extend_only(engine, ExtendRequest(context_id="a", token_ids=prefix))
        s = engine.stats()
        # A fill computes all but its last token (the next request computes it).
        assert [s.num_prefill_tokens, s.num_reused_tokens, s.num_decode_tokens] == [39, 0, 0]
        sync_client.extend_only(engine, ExtendRequest(context_id="b", token_ids=suffix, parent_context_id="a"))
        s = engine.stats()
        # The fork shares a's 39 computed tokens; it computes a's last token and 9 of its own.
        assert [s.num_prefill_tokens, s.num_reused_tokens, s.num_decode_tokens] == [49, 39, 0]
        sampling = SamplingParams(max_tokens=3, ignore_eos=True)
        events = sync_client.extend(engine, ExtendRequest(context_id="b", append=True, sampling=sampling))
        assert len(sync_client.token_ids(events)) == 3
        s = engine.stats()
        # b's last prompt token is computed with its first sample; b's 50 prompt tokens = 11 + 39.
        assert [s.num_prefill_tokens, s.num_reused_tokens, s.num_decode_tokens] == [50, 39, 3]
        # A generation forked from a filled context reuses its computed tokens and computes the last.
        events = sync_client.extend(engine, ExtendRequest(context_id="c", parent_context_id="a", sampling=sampling))
        assert len(sync_client.token_ids(events)) == 3
        s = engine.stats()
        assert [s.num_prefill_tokens, s.num_reused_tokens, s.num_decode_tokens] == [51, 78, 6]
    finally:
        engine.stop()
