"""The attention benchmark's reference path (the engine's first per-context decode) still runs and
agrees with today's engine path, whichever decode the engine's backend picks (native or torch)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.attention.shared_prefix import PerContextV1, build_batch
from parrot.engine import kernels
from parrot.engine.attention.base import PagedAttention
from parrot.engine.kernels.library import blocks_library, blocks_status
from parrot.engine.kv.cache import KVCache


@pytest.mark.parametrize("native", [True, False])
def test_first_per_context_path_matches_the_engine_path(native: bool) -> None:
    if native and not kernels.available():
        pytest.skip("needs gcc and an AVX512-BF16 CPU")
    seqs, _ = build_batch(3, 40, [5, 17, 33])
    num_blocks = max(max(s.block_table) for s in seqs) + 1
    cache = KVCache(1, num_blocks, 16, 3, 64, torch.bfloat16)
    cache.k.normal_()
    cache.v.normal_()
    q = torch.randn(3, 9, 64).bfloat16()
    ref, engine = PerContextV1(cache, 9, 3, 64, native), PagedAttention(cache, 9, 3, 64, native)
    ref.prepare_decode(seqs)
    engine.prepare_decode(seqs)
    assert engine.native == native
    torch.testing.assert_close(ref.decode(0, q), engine.decode(0, q), atol=4e-3, rtol=1.6e-2)


@pytest.mark.parametrize(
    "dtype",
    [
        pytest.param(torch.bfloat16, marks=pytest.mark.skipif(not kernels.available(), reason=kernels.status())),
        pytest.param(torch.float32, marks=pytest.mark.skipif(blocks_library() is None, reason=blocks_status())),
    ],
    ids=["bf16", "f32"],
)
def test_prefill_bench_paths_attend_alike(dtype: torch.dtype) -> None:
    """The prefill benchmark's three paths compute the same attention (chunk and per row: the same
    bits where the kernels share one per-row arithmetic), so its ratios compare speed only."""
    from benchmarks.attention.prefill import paths

    with torch.inference_mode():
        out = {name: fn() for name, fn in paths(40, 170, dtype).items()}
    assert out["chunk"].shape == (40, 9 * 64)
    assert out["chunk"].dtype == dtype
    tolerance = {"atol": 1e-2, "rtol": 1.6e-2} if dtype == torch.bfloat16 else {"atol": 1e-5, "rtol": 1e-4}
    if kernels.prefill_matches_decode(out["chunk"]):
        assert torch.equal(out["chunk"], out["per row"])
    else:
        torch.testing.assert_close(out["chunk"], out["per row"], **tolerance)
    torch.testing.assert_close(out["chunk"], out["sdpa"], **tolerance)
