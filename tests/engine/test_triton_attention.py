"""The Triton shared-prefix kernels under the interpreter (TRITON_INTERPRET=1, CPU tensors).

Same batches as the CPU tests but small: the interpreter is ~1,000x slower than torch. Compared
with the per-context reference (`PagedAttention`): fp32 atol=2e-6, rtol=1e-5; fp16 atol=rtol=1e-3;
bf16 atol=4e-3, rtol=1.6e-2 (the kernels upcast to fp32 in the interpreter; the output is rounded
to the input dtype once, the reference rounds once too, from a different summation order).
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported: it fixes its mode then

import queue
import random
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed (pip install triton==3.9.0); Triton kernels untested")
from parrot.engine import kernels
from parrot.engine.attention import shared_prefix_backend, triton_kernels
from parrot.engine.attention.base import PagedAttention, SeqSpec
from parrot.engine.attention.shared_prefix import GroupingConfig, plan_shared_prefixes
from parrot.engine.attention.shared_prefix_backend import TritonSharedPrefixAttention, triton_grouping
from parrot.engine.config import EngineConfig
from parrot.engine.kv.block_pool import BlockPool
from parrot.engine.kv.cache import KVCache
from parrot.engine.kv.context import Context, ContextTable
from parrot.engine.llm_engine import LLMEngine
from parrot.protocol.engine_api import ExtendRequest, TokenEvent
from parrot.protocol.sampling import SamplingParams


@pytest.fixture(autouse=True)
def _interpreter_usable() -> None:
    """Fail (not skip) when the kernels cannot run here although triton is installed."""
    reason = triton_kernels.unavailable_reason(torch.device("cpu"))
    if reason is not None:
        pytest.fail(f"Triton interpreter unusable: {reason}", pytrace=False)


TOL = {
    torch.float32: {"atol": 2e-6, "rtol": 1e-5},
    torch.float16: {"atol": 1e-3, "rtol": 1e-3},
    torch.bfloat16: {"atol": 4e-3, "rtol": 1.6e-2},
}
# Two nesting levels, several groups, a group of one, a context of its own (members as in
# test_shared_prefix_attention: an int is a decode row's own tokens, a pair a shared prefix).
NESTED = [(40, [(70, [3, 9, 20]), (33, [5, 1]), 7]), (64, [2, 4]), (50, [6]), 13]
GROUPING = GroupingConfig(min_shared_tokens=16)


def build_batch(spec: list, block_size: int, interleave: bool) -> tuple[list[SeqSpec], int]:
    pool = BlockPool(1 << 16)
    table = ContextTable(pool, block_size)
    seqs: list[SeqSpec] = []
    ids = iter(range(1 << 30))

    def walk(members: list, parent: Context | None) -> None:
        for m in members:
            ctx = table.create(f"c{next(ids)}", parent)
            n = m if isinstance(m, int) else m[0]
            for _ in range(n):  # one token at a time, as decode would
                table.reserve(ctx, ctx.num_computed + 1)
                ctx.num_computed += 1
                if interleave and ctx.num_computed % block_size == 0:
                    pool.allocate(1)
            if isinstance(m, int):
                seqs.append(SeqSpec(1, ctx.num_computed, list(ctx.block_table)))
            else:
                walk(m[1], ctx)

    walk(spec, None)
    return seqs, pool.num_blocks - pool.num_free


def setup(spec: list, block_size: int, dtype: torch.dtype, heads: tuple[int, int, int], seed: int = 0) -> tuple:
    hq, hkv, d = heads
    seqs, num_blocks = build_batch(spec, block_size, interleave=seed % 2 == 1)
    cache = KVCache(1, num_blocks, block_size, hkv, d, dtype)
    gen = torch.Generator().manual_seed(seed)
    cache.k.copy_(torch.randn(cache.k.shape, generator=gen))
    cache.v.copy_(torch.randn(cache.v.shape, generator=gen))
    q = torch.randn(len(seqs), hq, d, generator=gen).to(dtype)
    ref = PagedAttention(cache, hq, hkv, d, native=kernels.available())  # the engine's CPU path
    ref.prepare_decode(seqs)
    return seqs, cache, q, ref.decode(0, q)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("block_size", [1, 16])
def test_kernels_match_reference(block_size: int, dtype: torch.dtype) -> None:
    heads = (9, 3, 64)
    seqs, cache, q, expected = setup(NESTED, block_size, dtype, heads, seed=1)
    plan = plan_shared_prefixes([s.block_table for s in seqs], [s.seq_len for s in seqs], block_size, GROUPING)
    assert len(plan.segments) == 4  # a system prompt, its 2 documents, another prefix of two rows
    # Small chunks: every segment and most tails are split, so the merge combines many partials.
    meta = triton_kernels.TritonCascadeMeta.build(plan, block_size, 3, cache.k.device, prefix_split=32, tail_split=16)
    out = triton_kernels.cascade_decode(q, cache.k[0], cache.v[0], meta, heads[2] ** -0.5)
    torch.testing.assert_close(out, expected, **TOL[dtype])


@pytest.mark.parametrize("heads", [(8, 2, 32), (4, 4, 16)], ids=["gqa4", "mha"])
def test_backend_other_head_shapes(heads: tuple[int, int, int]) -> None:
    seqs, cache, q, expected = setup([(48, [2, 5, 3, 1]), 6], 4, torch.float32, heads)
    backend = TritonSharedPrefixAttention(cache, *heads, grouping=GROUPING)
    backend.prepare_decode(seqs)
    assert backend.plan is not None
    torch.testing.assert_close(backend.decode(0, q), expected, **TOL[torch.float32])


def test_backend_without_groups_is_a_paged_decode() -> None:
    seqs, cache, q, expected = setup([(10, [3, 4]), 30, 17], 16, torch.float32, (9, 3, 64))
    backend = TritonSharedPrefixAttention(cache, 9, 3, 64)  # default threshold: nothing pays
    backend.prepare_decode(seqs)
    assert backend.plan is None and backend.triton_meta is not None
    assert backend.triton_meta.prefix.work.shape[0] == 0
    torch.testing.assert_close(backend.decode(0, q), expected, **TOL[torch.float32])


def test_backend_groups_by_the_kv_bytes_a_segment_spares() -> None:
    # From the H200 sweep: a segment pays from ~48 MB of K and V reads spared per layer.
    assert triton_grouping(3, 64, 2).min_saved_tokens == 62_500  # 768 bytes a token
    assert triton_grouping(8, 128, 2).min_saved_tokens == 11_719  # 4 KiB a token
    assert triton_grouping(8, 128, 4).min_saved_tokens == 5_860
    _, cache, _, _ = setup([(48, [2, 5, 3, 1]), 6], 4, torch.float32, (8, 2, 32))
    assert TritonSharedPrefixAttention(cache, 8, 2, 32).grouping == triton_grouping(2, 32, 4)
    assert TritonSharedPrefixAttention(cache, 8, 2, 32, grouping=GROUPING).grouping == GROUPING


def test_backend_refuses_cpu_without_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triton_kernels, "INTERPRETED", False)  # as if compiled for CUDA
    cache = KVCache(1, 4, 16, 3, 64, torch.float32)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        TritonSharedPrefixAttention(cache, 9, 3, 64)


def test_engine_with_triton_backend(tiny_model_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy tokens and logprobs of forked contexts: Triton (interpreted) == per-context backend."""
    monkeypatch.setattr(shared_prefix_backend, "TRITON_MIN_SAVED_BYTES", 1)  # a tiny model's groups pay
    rng = random.Random(3)
    prefix = [rng.randrange(3, 40000) for _ in range(300)]
    turns = [[rng.randrange(3, 40000) for _ in range(4)] for _ in range(3)]
    results = []
    for attention in ("paged", "triton_shared_prefix"):
        config = EngineConfig(model=str(tiny_model_folder), dtype="float32", attention=attention, num_blocks=64)
        engine = LLMEngine(config)
        engine.start()
        try:
            run(engine, ExtendRequest(context_id="sys", token_ids=prefix))
            for i, turn in enumerate(turns):
                run(engine, ExtendRequest(context_id=f"t{i}", token_ids=turn, parent_context_id="sys"))
            sampling = SamplingParams(max_tokens=3, ignore_eos=True)
            handles = [
                submit(engine, ExtendRequest(context_id=f"t{i}", append=True, sampling=sampling)) for i in range(3)
            ]
            results.append([collect(h) for h in handles])
        finally:
            engine.stop()
    backend = engine.runner.backend
    assert isinstance(backend, TritonSharedPrefixAttention) and backend.num_shared_steps > 0
    assert [[t for t, _ in r] for r in results[1]] == [[t for t, _ in r] for r in results[0]]
    torch.testing.assert_close(torch.tensor(results[1]), torch.tensor(results[0]), atol=1e-4, rtol=0)


def submit(engine: LLMEngine, req: ExtendRequest) -> queue.Queue:
    events: queue.Queue = queue.Queue()
    engine.submit_extend(req, events.put)
    return events


def run(engine: LLMEngine, req: ExtendRequest) -> None:
    events: queue.Queue = queue.Queue()
    engine.submit_extend(req, events.put)
    assert events.get(timeout=300).finish_reason == "filled"


def collect(events: queue.Queue) -> list[tuple[int, float]]:
    out = []
    while True:
        ev = events.get(timeout=300)
        assert isinstance(ev, TokenEvent) and ev.token_id is not None and ev.logprob is not None, ev
        out.append((ev.token_id, ev.logprob))
        if ev.finish_reason is not None:
            return out
