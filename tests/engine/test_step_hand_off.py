"""A step's outputs leave the engine in one hand-off (`LLMEngine.hand_off`) carrying every row's
event, and the AsyncEngine turns it into one wake-up of the caller's event loop, not one per
token. The engine runs step by step (`LLMEngine.step`, no loop thread) so steps are exact."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from parrot.engine import sync_client
from parrot.engine.async_engine import AsyncEngine, put_all
from parrot.engine.config import EngineConfig
from parrot.engine.llm_engine import LLMEngine
from parrot.engine.sched.job import StepEvents, deliver
from parrot.protocol import ExtendRequest, Filled, SamplingParams, TokenEvent


@pytest.fixture
def engine(tiny_model_folder: Path) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(tiny_model_folder), dtype="float32", num_blocks=64, block_size=16))


def run_until_idle(engine: LLMEngine) -> int:
    num_steps = 0
    while engine.step():
        num_steps += 1
    return num_steps


def test_each_step_hands_off_all_its_rows_outputs_at_once(engine: LLMEngine) -> None:
    batches: list[StepEvents] = []

    def record(events: StepEvents) -> None:
        batches.append(list(events))
        deliver(events)

    engine.hand_off = record
    fills = [sync_client.submit(engine, ExtendRequest(context_id=f"c{i}", token_ids=[7 + i] * 9)) for i in range(3)]
    assert run_until_idle(engine) == 1  # the three prompts in one step
    assert [[(e.finish_reason, e.token_id) for _, e in b] for b in batches] == [[("filled", None)] * 3]
    assert [sync_client.wait_filled(h, timeout=1).num_tokens for h in fills] == [9, 9, 9]
    batches.clear()
    sampling = SamplingParams(max_tokens=4, ignore_eos=True)
    reqs = [ExtendRequest(context_id=f"c{i}", append=True, sampling=sampling) for i in range(3)]
    gens = [sync_client.submit(engine, req) for req in reqs]
    assert run_until_idle(engine) == 4  # one token of every generation per step
    assert [len(b) for b in batches] == [3, 3, 3, 3]
    sinks = {h.sink for h in gens}
    assert all({sink for sink, _ in b} == sinks for b in batches)  # one event per row, every row
    assert [[e.finish_reason for _, e in b] for b in batches][-1] == ["length"] * 3
    # The hand-off carried what each caller then read, in order.
    events = [sync_client.wait(h, timeout=1) for h in gens]
    for h, got in zip(gens, events, strict=True):
        assert [e for b in batches for s, e in b if s == h.sink] == got


def test_async_engine_wakes_the_callers_loop_once_per_step(engine: LLMEngine) -> None:
    async_engine = AsyncEngine(engine=engine)  # never started: this test drives each step

    async def main() -> tuple[list[int], int, list[list[TokenEvent]]]:
        loop = asyncio.get_running_loop()
        wakeups: list[int] = []  # events carried by each cross-thread call into this loop
        original = loop.call_soon_threadsafe

        def counting(callback, *args, **kwargs):  # type: ignore[no-untyped-def]
            if callback is put_all:
                wakeups.append(len(args[0]))
            return original(callback, *args, **kwargs)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]

        async def generate(i: int) -> list[TokenEvent]:
            sampling = SamplingParams(max_tokens=3, ignore_eos=True)
            req = ExtendRequest(context_id=f"w{i}", token_ids=[5 + i] * 6, sampling=sampling)
            return [e async for e in async_engine.extend(req)]

        tasks = [asyncio.create_task(generate(i)) for i in range(3)]
        await asyncio.sleep(0)  # every task submits before the first step
        num_steps = await asyncio.to_thread(run_until_idle, engine)
        return wakeups, num_steps, list(await asyncio.gather(*tasks))

    wakeups, num_steps, results = asyncio.run(main())
    assert [num_steps, wakeups] == [3, [3, 3, 3]]  # the fills' results ride on the first tokens' events
    assert [[e.finish_reason for e in r] for r in results] == [[None, None, "length"]] * 3
    assert [[e.filled for e in r] for r in results] == [[Filled(num_tokens=6, num_filled_tokens=5), None, None]] * 3
