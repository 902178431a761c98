"""A long step of lower-tier work is interrupted between layers when a better-tier request arrives:
nothing of it is applied, it is planned again with the newcomer, and every output is the same as
without the interruption (float32 tiny model, steps driven by the test)."""

from __future__ import annotations

from pathlib import Path

from parrot.engine import sync_client
from parrot.engine.config import EngineConfig
from parrot.engine.llm_engine import LLMEngine
from parrot.protocol import ExtendRequest, SamplingParams

SAMPLING = SamplingParams(max_tokens=5, ignore_eos=True)
FLOOD = ExtendRequest(context_id="flood", token_ids=[7 + i % 50 for i in range(300)], sampling=SAMPLING)
VICTIM = ExtendRequest(context_id="victim", token_ids=[11, 12, 13], sampling=SAMPLING, priority=2)


def make_engine(folder: Path) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(folder), dtype="float32", num_blocks=64, block_size=16))


def tokens(handle: sync_client.Handle) -> list[int]:
    return [e.token_id for e in sync_client.wait(handle, timeout=5) if e.token_id is not None]


def alone(folder: Path, req: ExtendRequest) -> list[int]:
    engine = make_engine(folder)
    handle = sync_client.submit(engine, req)
    while engine.step():
        pass
    return tokens(handle)


def test_a_better_tier_arrival_interrupts_a_long_step_and_nothing_changes(tiny_model_folder: Path) -> None:
    engine = make_engine(tiny_model_folder)
    engine.start_trace()
    flood = sync_client.submit(engine, FLOOD)
    arrivals: list[sync_client.Handle] = []
    run = engine.runner.run

    def arrive_mid_step(seqs, interrupt=None):  # type: ignore[no-untyped-def]
        if not arrivals:  # the victim comes while the flood's prompt is being computed
            arrivals.append(sync_client.submit(engine, VICTIM))
        return run(seqs, interrupt)

    engine.runner.run = arrive_mid_step  # type: ignore[method-assign]
    while engine.step():
        pass
    steps = engine.stop_trace()
    assert engine.stats().num_interrupted_steps == 1
    # The interrupted step is not recorded; the next one computes the victim's prompt and the
    # flood's outranked share (4 prompt tokens), then the victim decodes beside small flood chunks.
    assert [[s.num_decode, s.num_prefill_tokens] for s in steps[:2]] == [[0, 3 + 4], [1, 4]]
    assert [tokens(arrivals[0]), tokens(flood)] == [alone(tiny_model_folder, VICTIM), alone(tiny_model_folder, FLOOD)]
