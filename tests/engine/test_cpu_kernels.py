"""The native CPU kernels: the same results as the model's torch reference (F.linear up to one
bf16 ulp, the elementwise steps rounding where the reference rounds), clean fallbacks, and the
native transform of a whole model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from parrot.engine import kernels
from parrot.engine.model.layers import add_rms_norm_reference, rms_norm_reference, silu_mul_reference
from parrot.engine.model.rope import RotaryStep

needs_kernel = pytest.mark.skipif(not kernels.available(), reason="no AVX512-BF16 CPU or no C compiler")


def within_bf16_rounding(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """|out - exact| <= half a bf16 ulp of the exact value plus fp32 accumulation error."""
    exact = x.double() @ w.double().T + (0 if bias is None else bias.double())
    magnitude = x.double().abs() @ w.double().abs().T
    bound = exact.abs() * 2.0**-8 + magnitude * x.shape[1] * 2.0**-24
    return bool(torch.all((out.double() - exact).abs() <= bound))


@needs_kernel
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 16, 17, 33, 64, 200])
@pytest.mark.parametrize(("n", "k"), [(960, 576), (8192, 576), (576, 1536), (7, 100), (13, 33), (64, 64)])
def test_matches_torch_within_bf16_rounding(m: int, n: int, k: int) -> None:
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    x = torch.randn(m, k, generator=g).bfloat16()
    w = (torch.randn(n, k, generator=g) * 0.05).bfloat16()
    bias = torch.randn(n, generator=g).bfloat16()
    packed = kernels.pack_amx(w)
    # The AMX layout exists for shapes in 32-multiples on AMX CPUs only.
    assert (packed is not None) == (kernels.amx_available() and n % 32 == 0 and k % 32 == 0)
    with torch.inference_mode():
        for b in (None, bias):
            ours, ref = kernels.linear(x, w, b, packed), F.linear(x, w, b)
            assert ours.shape == ref.shape and ours.dtype == torch.bfloat16
            assert within_bf16_rounding(ref, x, w, b)  # the bound holds for torch itself
            assert within_bf16_rounding(ours, x, w, b)
            assert (ours != ref).float().mean().item() < 0.01  # rounding, not a different result


@needs_kernel
def test_strided_rows_are_read_with_their_stride() -> None:
    big = torch.randn(3, 200).bfloat16()
    x = big[:, 8:72]  # rows 200 elements apart
    w = torch.randn(24, 64).bfloat16()
    with torch.inference_mode():
        torch.testing.assert_close(kernels.linear(x, w), F.linear(x, w), rtol=1.6e-2, atol=1e-2)


def test_ineligible_inputs_take_the_torch_path() -> None:
    w32 = torch.randn(8, 16)
    x32 = torch.randn(2, 16)
    with torch.inference_mode():
        assert torch.equal(kernels.linear(x32, w32), F.linear(x32, w32))  # float32
        xb, wb = torch.randn(kernels.DOT_MAX_ROWS + 1, 64).bfloat16(), torch.randn(64, 64).bfloat16()
        assert torch.equal(kernels.linear(xb, wb), F.linear(xb, wb))  # no packed weights: no AMX
        xb = torch.randn(kernels.AMX_MAX_ROWS + 1, 64).bfloat16()
        packed = kernels.pack_amx(wb)
        assert torch.equal(kernels.linear(xb, wb, None, packed), F.linear(xb, wb))  # too many rows
    xg = torch.randn(1, 16).bfloat16().requires_grad_()
    out = kernels.linear(xg, torch.randn(8, 16).bfloat16())
    assert out.requires_grad  # autograd needs torch's op


@needs_kernel
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim", "block_size"),
    [(9, 3, 64, 16), (4, 4, 128, 1), (8, 2, 32, 5)],  # two inlined shapes, then the generic path
)
def test_paged_decode_matches_the_sdpa_path(num_heads: int, num_kv_heads: int, head_dim: int, block_size: int) -> None:
    from parrot.engine.attention.base import PagedAttention, SeqSpec
    from parrot.engine.kv.cache import KVCache

    g = torch.Generator().manual_seed(head_dim + block_size)
    lens = [1, 2, 17, 40, 300]
    num_blocks = sum(-(-n // block_size) for n in lens) + 3
    cache = KVCache(1, num_blocks, block_size, num_kv_heads, head_dim, torch.bfloat16)
    cache.k.copy_(torch.randn(cache.k.shape, generator=g) * 2)
    cache.v.copy_(torch.randn(cache.v.shape, generator=g))
    perm = torch.randperm(num_blocks, generator=g).tolist()  # scattered, non-monotonic block tables
    specs, start = [], 0
    for n in lens:
        nb = -(-n // block_size)
        specs.append(SeqSpec(1, n, perm[start : start + nb]))
        start += nb
    # Rows of q are strided like the model's (q and k heads share one projection row).
    qk = torch.randn(len(lens), num_heads + num_kv_heads, head_dim, generator=g).bfloat16()
    q = qk[:, :num_heads]
    outs = {}
    for native in (True, False):
        backend = PagedAttention(cache, num_heads, num_kv_heads, head_dim, native)
        backend.prepare_decode(specs)
        assert backend.native is native
        with torch.inference_mode():
            outs[native] = backend.decode(0, q)
    assert outs[True].shape == (len(lens), num_heads * head_dim)
    torch.testing.assert_close(outs[True], outs[False], atol=4e-3, rtol=1.6e-2)
    # A one-token context attends only to itself: the output is its V row (rounded once).
    first = cache.v[0, perm[0], 0].repeat_interleave(num_heads // num_kv_heads, dim=0).reshape(-1)
    torch.testing.assert_close(outs[True][0], first, atol=0, rtol=0)


@needs_kernel
def test_argmax_logsumexp_matches_torch() -> None:
    g = torch.Generator().manual_seed(5)
    logits = (torch.randn(6, 49157, generator=g) * 4).bfloat16()  # V not a multiple of 16
    logits[2, 100] = logits[2, 7] = 40.0  # a tie: the first index wins, as in torch.argmax
    logits[3, -1] = 50.0  # the maximum in the scalar tail
    logits[4] = float("-inf")
    logits[4, 3] = 1.0  # one finite logit: probability 1
    idx, lse = kernels.argmax_logsumexp(logits)
    ref = logits.float()
    assert idx.tolist() == ref.argmax(dim=-1).tolist()
    assert idx[2].item() == 7 and idx[3].item() == 49156
    torch.testing.assert_close(lse, torch.logsumexp(ref, dim=-1), atol=1e-5, rtol=1e-6)
    assert lse[4].item() == 1.0


def _close_in_bf16(a: torch.Tensor, b: torch.Tensor, max_fraction: float = 0.01) -> None:
    """Equal but for rare one-ulp rounding differences (a reduction or exp in another order)."""
    assert a.shape == b.shape and a.dtype == b.dtype == torch.bfloat16
    torch.testing.assert_close(a, b, atol=1e-2, rtol=8e-3)
    assert (a != b).float().mean().item() <= max_fraction


@needs_kernel
def test_fused_elementwise_steps_round_like_the_reference() -> None:
    g = torch.Generator().manual_seed(11)
    n, d, heads, inter = 37, 576, 12, 1536
    x = torch.randn(n, d, generator=g).bfloat16()
    delta = torch.randn(n, d, generator=g).bfloat16()
    w = (1 + torch.randn(d, generator=g) * 0.1).bfloat16()
    with torch.inference_mode():
        _close_in_bf16(kernels.rms_norm(x, w, 1e-5), rms_norm_reference(x, w, 1e-5))
        r, h = kernels.add_rms_norm(x, delta, w, 1e-5)
        r_ref, h_ref = add_rms_norm_reference(x, delta, w, 1e-5)
        assert torch.equal(r, r_ref)  # one rounded add: exact
        _close_in_bf16(h, h_ref)

        # RoPE has no reduction: the same rounding steps give the same bits, strided rows included.
        cos, sin = torch.randn(64, 64, generator=g), torch.randn(64, 64, generator=g)
        positions = torch.randint(0, 64, (n,), generator=g)
        qkv = torch.randn(n, (heads + 3) * 64, generator=g).bfloat16()
        qk = qkv[:, : heads * 64].view(n, heads, 64)
        v_before = qkv[:, heads * 64 :].clone()
        expected = RotaryStep(positions, cos, sin).apply(qk.clone())
        rotated = kernels.rope(qk, positions, cos, sin)
        assert torch.equal(rotated, expected)
        assert torch.equal(qkv[:, heads * 64 :], v_before)  # in place, and only on the q/k columns

        gate_up = (torch.randn(n, 2 * inter, generator=g) * 3).bfloat16()
        _close_in_bf16(kernels.silu_mul(gate_up), silu_mul_reference(gate_up))


@needs_kernel
def test_paged_decode_propagates_nan_like_sdpa() -> None:
    from parrot.engine.attention.base import PagedAttention, SeqSpec
    from parrot.engine.kv.cache import KVCache

    cache = KVCache(1, 4, 16, 1, 64, torch.bfloat16)
    cache.k.normal_()
    cache.v.normal_()
    cache.k[0, 1, 3, 0, 0] = float("nan")  # token 19 of the second sequence
    backend = PagedAttention(cache, 2, 1, 64, native=True)
    backend.prepare_decode([SeqSpec(1, 16, [0]), SeqSpec(1, 20, [2, 1])])
    assert backend.native
    with torch.inference_mode():
        out = backend.decode(0, torch.randn(2, 2, 64).bfloat16())
    assert bool(torch.isfinite(out[0]).all()) and bool(torch.isnan(out[1]).all())
