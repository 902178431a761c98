"""The simulated engine on the virtual clock: the engine API's rules and exact step timing.

Toy device: 10 ms per step and nothing else (infinite FLOP/s and bandwidth in effect), so a run's
virtual time is 10 ms x its steps; a 4-token step budget makes chunking visible.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

from parrot.protocol.engine_api import ExtendRequest, Filled, FreeContextRequest, TokenEvent
from parrot.protocol.engine_client import extend_only
from parrot.protocol.errors import ParrotError
from parrot.protocol.objective import Objective
from parrot.protocol.sampling import SamplingParams
from parrot.sim.engine import SimEngine
from parrot.sim.loop import run_virtual
from parrot.sim.profiles import HardwareProfile, Setup, model

HW = HardwareProfile(
    "toy",
    "",
    peak_tflops=1e12,
    mem_gb=1.0,
    mem_bw_gbps=1e12,
    mfu=1.0,
    bw_efficiency=1.0,
    step_overhead_ms=10.0,
    row_overhead_ms=0.0,
    combine="max",
    gpu_mem_util=1.0,
)


def toy_engine(num_blocks: int = 64, budget: int = 4, **rules: Any) -> SimEngine:
    """`rules`: the setup's other step settings (cap, latency_prefill_tokens, ...)."""
    rules.setdefault("latency_max_batched_tokens", budget)
    setup = Setup(
        "toy",
        "",
        HW,
        model("smollm2-135m"),
        block_size=4,
        max_num_batched_tokens=budget,
        max_model_len=256,
        num_blocks=num_blocks,
        engines=1,
        **rules,
    )
    return SimEngine(setup, Path("unused"))


def run(main: Coroutine[Any, Any, Any]) -> Any:
    return run_virtual(main)


async def collect(engine: SimEngine, req: ExtendRequest) -> tuple[list[TokenEvent], float]:
    events = [e async for e in engine.extend(req)]
    return events, asyncio.get_running_loop().time()


def test_generate_with_fill_chunks_the_prompt_and_samples_in_its_last_chunk() -> None:
    async def main() -> None:
        engine = toy_engine()
        req = ExtendRequest(context_id="a", token_ids=list(range(10)), sampling=SamplingParams(max_tokens=3))
        events, t = await collect(engine, req)
        # chunks 4, 4, 2 (the last samples token 1), then 2 decode steps: 5 steps of 10 ms
        assert t == pytest.approx(0.050, abs=1e-9)
        assert [e.finish_reason for e in events] == [None, None, "length"]
        assert [e.filled for e in events] == [Filled(num_tokens=10, num_filled_tokens=9), None, None]
        assert events[-1].output_token_ids == [260, 260, 260]
        ctx = engine.kv.contexts["a"]
        assert [ctx.num_tokens, ctx.num_computed, len(ctx.blocks)] == [13, 12, 3]
        stats = await engine.stats()
        assert [stats.num_steps, stats.num_prefill_tokens, stats.num_decode_tokens] == [5, 10, 3]

    run(main())


def test_fill_computes_all_but_its_last_token_then_a_fork_reuses_them() -> None:
    async def main() -> None:
        engine = toy_engine()
        result = await extend_only(engine, ExtendRequest(context_id="p", token_ids=list(range(9))))
        assert [result.num_tokens, result.num_filled_tokens] == [9, 8]
        assert asyncio.get_running_loop().time() == pytest.approx(0.020, abs=1e-9)  # 4 + 4 tokens
        req = ExtendRequest(
            context_id="c", parent_context_id="p", token_ids=[1, 2], sampling=SamplingParams(max_tokens=1)
        )
        events, t = await collect(engine, req)
        # the fork shares 8 computed tokens (2 full blocks): it computes 3 (1 of the parent's, 2 new)
        assert [len(events), (await engine.stats()).num_reused_tokens, engine.counters.num_prefill_tokens] == [1, 8, 11]
        assert events[0].filled == Filled(num_tokens=11, num_filled_tokens=2)  # its last token is the generation's
        assert t == pytest.approx(0.030, abs=1e-9)
        assert engine.kv.contexts["c"].blocks[:2] == engine.kv.contexts["p"].blocks
        # Without sampling: one `filled` event; a plain generation's events carry no `filled`.
        events, _ = await collect(engine, ExtendRequest(context_id="p", token_ids=[5], append=True))
        assert [(e.finish_reason, e.filled) for e in events] == [("filled", Filled(num_tokens=10, num_filled_tokens=1))]
        req = ExtendRequest(context_id="p", append=True, sampling=SamplingParams(max_tokens=2))
        events, _ = await collect(engine, req)
        assert [e.filled for e in events] == [None, None]

    run(main())


def test_free_rules() -> None:
    async def main() -> None:
        engine = toy_engine()
        stream = engine.extend(
            ExtendRequest(context_id="a", token_ids=[1, 2, 3], sampling=SamplingParams(max_tokens=5))
        )
        await anext(stream)
        with pytest.raises(ParrotError) as busy:
            await engine.free(FreeContextRequest(context_id="a"))
        assert busy.value.status == 409
        await stream.aclose()  # aborts the generation
        await engine.free(FreeContextRequest(context_id="a"))
        assert [engine.kv.num_free, list(engine.kv.contexts)] == [64, []]
        with pytest.raises(ParrotError) as missing:
            await engine.free(FreeContextRequest(context_id="a"))
        assert missing.value.status == 404

    run(main())


def test_work_that_can_never_fit_is_refused_naming_the_field() -> None:
    async def main() -> None:
        engine = toy_engine(num_blocks=2)
        with pytest.raises(ParrotError) as e:
            await extend_only(engine, ExtendRequest(context_id="a", token_ids=list(range(9))))
        assert [e.value.status, e.value.field] == [400, "token_ids"]

    run(main())


def test_out_of_blocks_preempts_the_lower_ranked_generation_which_recomputes() -> None:
    async def main() -> None:
        # 4 blocks of 4 slots. Two generations of 4 prompt tokens and 6 outputs need 3 blocks each
        # at the end: both cannot finish together, so the throughput one is preempted.
        engine = toy_engine(num_blocks=4, budget=8)
        fast = ExtendRequest(context_id="lat", token_ids=[1] * 4, sampling=SamplingParams(max_tokens=6))
        slow = ExtendRequest(
            context_id="tput", token_ids=[2] * 4, sampling=SamplingParams(max_tokens=6), objective=Objective.THROUGHPUT
        )
        (lat_events, lat_t), (tput_events, tput_t) = await asyncio.gather(collect(engine, fast), collect(engine, slow))
        assert [len(lat_events), len(tput_events), engine.scheduler.num_preemptions] == [6, 6, 1]
        # steps 1-5: both prefill (1 block each), then decode into a second block each, 5 tokens
        # sampled; step 6: the latency row needs a 5th block: the throughput one is preempted (its
        # 2 blocks dropped) and the latency call ends at 60 ms; the freed room lets the preempted
        # one recompute 4 of its 8 tokens; step 7: the idle finished context is reclaimed for the
        # other 4; step 8: its last token, at 80 ms.
        assert [lat_t, tput_t] == pytest.approx([0.060, 0.080], abs=1e-9)
        assert [engine.counters.num_steps, engine.counters.num_prefill_tokens, engine.counters.peak_blocks_used] == [
            8,
            16,
            4,
        ]
        lat = engine.kv.contexts["lat"]
        assert [lat.num_tokens, lat.num_computed, lat.blocks] == [10, 0, []]

    run(main())


def gen(context_id: str, num_prompt: int, max_tokens: int, **fields: Any) -> ExtendRequest:
    return ExtendRequest(
        context_id=context_id, token_ids=[3] * num_prompt, sampling=SamplingParams(max_tokens=max_tokens), **fields
    )


@pytest.mark.parametrize(
    ("rules", "objective", "end_s"),
    [
        # Latency work that only prefills takes latency_prefill_tokens a step: 8 + 8, then 1 decode.
        ({"latency_prefill_tokens": 8}, Objective.LATENCY, 0.030),
        # Without the setting it takes the full budget: 16, then 1 decode.
        ({}, Objective.LATENCY, 0.020),
        # Throughput work alone always takes the full budget.
        ({"latency_prefill_tokens": 8}, Objective.THROUGHPUT, 0.020),
    ],
)
def test_latency_work_that_only_prefills_takes_latency_prefill_tokens_a_step(
    rules: dict[str, int], objective: Objective, end_s: float
) -> None:
    async def main() -> float:
        engine = toy_engine(budget=16, latency_max_batched_tokens=4, **rules)
        events, t = await collect(engine, gen("a", 16, 2, objective=objective))
        assert len(events) == 2
        return t

    assert run(main()) == pytest.approx(end_s, abs=1e-9)


@pytest.mark.parametrize(("share", "end_s"), [(2, 0.010), (None, 0.020)])
def test_a_prompts_last_chunk_runs_over_a_decode_free_step_by_budget_over_remainder_share(
    share: int | None, end_s: float
) -> None:
    async def main() -> float:
        # Budget 8 (latency work prefilling), slack min(8 // 2, 16 - 8) = 4: a 12-token prompt is
        # one step; without the rule 8 + 4.
        engine = toy_engine(budget=16, latency_max_batched_tokens=4, latency_prefill_tokens=8, remainder_share=share)
        _, t = await collect(engine, gen("a", 12, 1))
        return t

    assert run(main()) == pytest.approx(end_s, abs=1e-9)


@pytest.mark.parametrize(("limit", "low_end_s"), [(2, 0.040), (None, 0.010)])
def test_lower_priority_prompts_share_outranked_chunk_tokens_a_step(limit: int | None, low_end_s: float) -> None:
    async def main() -> list[float]:
        # Priority 1 (4 prompt tokens, 5 outputs) beside priority 0 (8 prompt tokens, 1 output):
        # with a limit of 2 the lower one computes 2 prompt tokens a step (4 steps), without it
        # all 8 in the first step; the higher one ends after 5 steps either way.
        engine = toy_engine(budget=16, outranked_chunk_tokens=limit)
        tput = Objective.THROUGHPUT
        (high, high_t), (low, low_t) = await asyncio.gather(
            collect(engine, gen("high", 4, 5, objective=tput, priority=1)),
            collect(engine, gen("low", 8, 1, objective=tput, priority=0)),
        )
        assert len(high) == 5
        assert len(low) == 1
        return [high_t, low_t]

    high_t, low_t = run(main())
    assert high_t == pytest.approx(0.050, abs=1e-9)
    assert low_t == pytest.approx(low_end_s, abs=1e-9)
