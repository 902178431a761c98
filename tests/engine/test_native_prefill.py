"""The native causal prefill kernels (kernels.paged_prefill, bf16 on AVX512-BF16, float32 on AVX2):
the same attention as the SDPA path, causal exactly, and a row's bits independent of how its prompt
was chunked and of the step's other sequences."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from parrot.engine import kernels
from parrot.engine.attention.base import PagedAttention, SeqSpec, gather_blocks
from parrot.engine.kernels.library import blocks_library, blocks_status
from parrot.engine.kv.cache import KVCache

needs_kernel = pytest.mark.skipif(not kernels.available(), reason="no AVX512-BF16 CPU or no C compiler")
DTYPES = [
    pytest.param(torch.bfloat16, marks=needs_kernel, id="bf16"),
    pytest.param(torch.float32, marks=pytest.mark.skipif(blocks_library() is None, reason=blocks_status()), id="f32"),
]
AMX_ATTENTION = kernels.attention_amx()  # bf16 attention on AMX: this CPU's default where it has AMX


@pytest.fixture(params=["default", "avx512_bf16"] if AMX_ATTENTION else ["default"], autouse=True)
def attention_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Where bf16 attention runs on AMX, every test here runs again on the AVX512-BF16 kernels."""
    if request.param != "default":
        kernels.attention_amx(False)
    try:
        yield request.param
    finally:
        kernels.attention_amx(AMX_ATTENTION)


# Against SDPA: bf16 rounds its probabilities to bf16 for the V sum; float32 only sums in another order.
TOLERANCE = {torch.bfloat16: {"atol": 1e-2, "rtol": 1.6e-2}, torch.float32: {"atol": 1e-5, "rtol": 1e-4}}


def _cache(
    num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, seed: int, dtype: torch.dtype = torch.bfloat16
) -> KVCache:
    cache = KVCache(1, num_blocks, block_size, num_kv_heads, head_dim, dtype)
    g = torch.Generator().manual_seed(seed)
    cache.k.copy_(torch.randn(cache.k.shape, generator=g) * 2)
    cache.v.copy_(torch.randn(cache.v.shape, generator=g))
    return cache


def _prefill(backend: PagedAttention, seqs: list[SeqSpec], q: torch.Tensor) -> torch.Tensor:
    """Attention of the step's rows: prefill chunks whose K/V are already in the cache."""
    backend.prepare(seqs, torch.empty(0, dtype=torch.long))
    assert backend.num_decode == 0 and len(backend.prefills) == len(seqs)
    outs = []
    with torch.inference_mode():
        for p in backend.prefills:
            past = p.seq_len - p.num_new  # the chunk's own K/V rows, as `forward` hands them over
            k = gather_blocks(backend.cache.k[0], p.block_ids)[past : p.seq_len]
            v = gather_blocks(backend.cache.v[0], p.block_ids)[past : p.seq_len]
            outs.append(backend.prefill(0, p, q[p.row_start : p.row_start + p.num_new], k, v))
    return torch.cat(outs)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "block_size"),
    [(9, 3, 64, 16), (4, 1, 128, 16), (8, 2, 32, 5), (2, 2, 256, 3)],  # two inlined shapes, two generic
)
def test_paged_prefill_matches_the_sdpa_path(
    num_heads: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype
) -> None:
    # (new tokens, sequence length): a whole prompt, chunks after cached tokens, one-token prompts,
    # lengths on and off the kernel's 64-token tiles and 32-token query blocks.
    shapes = [(1, 1), (37, 37), (64, 64), (130, 130), (20, 150), (1, 77), (70, 200)]
    num_blocks = sum(-(-s // block_size) for _, s in shapes) + 2
    cache = _cache(num_blocks, block_size, num_kv_heads, head_dim, seed=head_dim + block_size, dtype=dtype)
    g = torch.Generator().manual_seed(7)
    perm = torch.randperm(num_blocks, generator=g).tolist()  # scattered, non-monotonic block tables
    seqs, start = [], 0
    for t, s in shapes:
        nb = -(-s // block_size)
        seqs.append(SeqSpec(t, s, perm[start : start + nb]))
        start += nb
    # Rows of q are strided like the model's (q and k heads share one projection row).
    rows = sum(t for t, _ in shapes)
    q = torch.randn(rows, num_heads + num_kv_heads, head_dim, generator=g).to(dtype)[:, :num_heads]
    native, torch_path = (PagedAttention(cache, num_heads, num_kv_heads, head_dim, n) for n in (True, False))
    assert native.native_prefill and not torch_path.native_prefill
    ours, ref = _prefill(native, seqs, q), _prefill(torch_path, seqs, q)
    assert ours.shape == (rows, num_heads * head_dim) and ours.dtype == dtype
    torch.testing.assert_close(ours, ref, **TOLERANCE[dtype])
    # A first token attends only to itself: its output is its V row, exactly.
    first = cache.v[0, perm[0], 0].repeat_interleave(num_heads // num_kv_heads, dim=0).reshape(-1)
    assert torch.equal(ours[0], first)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_rows_bits_do_not_depend_on_chunking_or_the_batch(dtype: torch.dtype) -> None:
    cache = _cache(24, 16, 3, 64, seed=3, dtype=dtype)
    table = list(range(23, 9, -1))  # 14 blocks: 224 slots
    n = 210
    q = torch.randn(n, 9, 64).to(dtype)
    backend = PagedAttention(cache, 9, 3, 64, native=True)
    whole = _prefill(backend, [SeqSpec(n, n, table)], q)
    # The same prompt in chunks of 50, 1 (a one-token chunk after cached ones is a decode row: not
    # here), 33, 100 and 26 tokens, each chunk alone in its step.
    pieces, done = [], 0
    for size in (50, 33, 101, 26):
        pieces.append(_prefill(backend, [SeqSpec(size, done + size, table)], q[done : done + size]))
        done += size
    assert torch.equal(torch.cat(pieces), whole)
    # Beside another sequence's prompt in the same step.
    other = _prefill(
        backend, [SeqSpec(5, 5, [0]), SeqSpec(n, n, table)], torch.cat([torch.randn(5, 9, 64).to(dtype), q])
    )
    assert torch.equal(other[5:], whole)


@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_prefill_is_causal_and_propagates_nan_like_sdpa(dtype: torch.dtype) -> None:
    cache = _cache(4, 16, 1, 64, seed=5, dtype=dtype)
    cache.k[0, 1, 3, 0, 0] = float("nan")  # token 19 of the sequence [0, 1, 2]
    backend = PagedAttention(cache, 2, 1, 64, native=True)
    out = _prefill(backend, [SeqSpec(40, 40, [0, 1, 2])], torch.randn(40, 2, 64).to(dtype))
    # Rows before token 19 never see it; it and every row after do, as in SDPA.
    assert bool(torch.isfinite(out[:19]).all()) and bool(torch.isnan(out[19:]).all())


@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_prefill_refuses_inconsistent_shapes(dtype: torch.dtype) -> None:
    cache = _cache(4, 16, 1, 64, seed=1, dtype=dtype)
    q = torch.randn(10, 2, 64).to(dtype)
    ids = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="10 queries, 9 tokens"):
        kernels.paged_prefill(q, cache.k[0], cache.v[0], ids, 9, 0.125)  # more queries than tokens
    with pytest.raises(ValueError, match="2 blocks of 16"):
        kernels.paged_prefill(q, cache.k[0], cache.v[0], ids, 33, 0.125)  # blocks do not cover the tokens
    with pytest.raises(ValueError, match="all bfloat16 or all float32"):
        kernels.paged_prefill(q.double(), cache.k[0], cache.v[0], ids, 10, 0.125)
    odd = _cache(4, 16, 1, 24, seed=1, dtype=dtype)  # a head size neither kernel takes
    with pytest.raises(ValueError, match="no kernel for 2 / 1 heads of 24"):
        kernels.paged_prefill(torch.randn(10, 2, 24).to(dtype), odd.k[0], odd.v[0], ids, 10, 0.125)


@needs_kernel
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "block_size"), [(9, 3, 64, 16), (4, 1, 128, 7), (8, 2, 32, 5)]
)
def test_a_prompt_row_has_the_bits_of_a_decode_row(
    num_heads: int, num_kv_heads: int, head_dim: int, block_size: int
) -> None:
    """Token i of a prompt, attended in a prefill chunk, equals the same query as a decode row over
    keys 0..i: generated and filled tokens get the same K/V downstream."""
    n = 150
    ids = torch.arange(1, -(-n // block_size) + 1)
    # Many draws: a difference of one fp32 ulp in a row's softmax sum shows as a bf16 ulp in about
    # one output in 5,000 (the kernels' shared softmax once summed with and without an FMA).
    for seed in range(100):
        cache = _cache(-(-n // block_size) + 1, block_size, num_kv_heads, head_dim, seed=head_dim + seed)
        g = torch.Generator().manual_seed(seed)
        q = torch.randn(n, num_heads + num_kv_heads, head_dim, generator=g).bfloat16()[:, :num_heads]
        k, v, scale = cache.k[0], cache.v[0], head_dim**-0.5
        with torch.inference_mode():
            chunk = kernels.paged_prefill(q, k, v, ids, n, scale)
            rows = kernels.paged_decode(q, k, v, ids.expand(n, -1), torch.arange(1, n + 1), scale)
            tail = kernels.paged_prefill(q[97:], k, v, ids, n, scale)  # a later chunk of the same prompt
        assert torch.equal(chunk, rows), seed
        assert torch.equal(tail, chunk[97:]), seed
