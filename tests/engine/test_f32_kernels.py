"""The float32 engine's AVX2 kernels besides its linears (block_kernels.c; test_block_kernels.py has
the linears). Decode attention (`parrot_cascade_decode_f32`, through kernels.paged_decode /
cascade_decode): agreement with float64 attention over the same paged KV at every supported head
shape, a row's bits independent of the rest of the batch, NaN rows, and which backend paths take
it (the cascade grouping is tested in test_shared_prefix_attention.py). The elementwise steps
(RMSNorm + residual add, RoPE, SiLU*up through kernels.ops): against the model's torch references,
and the transform that swaps them into a float32 model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from parrot.engine import kernels
from parrot.engine.attention.base import PagedAttention, SeqSpec
from parrot.engine.attention.rowwise import RowwiseAttention
from parrot.engine.kernels.fused import FusedDecoderLayer
from parrot.engine.kernels.library import blocks_library, blocks_status
from parrot.engine.kernels.pieces import NativeRMSNorm, NativeRotary, NativeSiluMul
from parrot.engine.kv.cache import KVCache
from parrot.engine.model.layers import RMSNorm, SiluMul, add_rms_norm_reference, rms_norm_reference, silu_mul_reference
from parrot.engine.model.llama import DecoderLayer, LlamaModel
from parrot.engine.model.loader import load_model
from parrot.engine.model.rope import Rotary, RotaryStep, cos_sin_table, inv_freq

pytestmark = pytest.mark.skipif(blocks_library() is None, reason=blocks_status())
FP32 = {"atol": 1e-6, "rtol": 1e-5}  # float32 sums against float64 ones


def paged_kv(num_blocks: int, bs: int, hkv: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(num_blocks, bs, hkv, d, generator=gen), torch.randn(num_blocks, bs, hkv, d, generator=gen)


def reference(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, table: list[int], n: int) -> torch.Tensor:
    """One row's attention in float64 over its first n keys: q [Hq, D] -> [Hq * D]."""
    hq, hkv = q.shape[0], kc.shape[2]
    keys = kc[table].flatten(0, 1)[:n].double().repeat_interleave(hq // hkv, dim=1)  # [n, Hq, D]
    vals = vc[table].flatten(0, 1)[:n].double().repeat_interleave(hq // hkv, dim=1)
    probs = torch.softmax(torch.einsum("hd,nhd->hn", q.double(), keys) * q.shape[1] ** -0.5, dim=-1)
    return torch.einsum("hn,nhd->hd", probs, vals).reshape(-1)


@pytest.mark.parametrize(("hq", "hkv", "d"), [(9, 3, 64), (4, 1, 64), (8, 2, 128), (6, 3, 40), (4, 4, 256), (2, 1, 8)])
@pytest.mark.parametrize("bs", [1, 16])
def test_paged_decode_matches_float64(hq: int, hkv: int, d: int, bs: int) -> None:
    lens = [1, 7, 8, 31, 32, 33, 100, 257]  # around the 8-key score groups and the 32-key tiles
    width = -(-max(lens) // bs)
    kc, vc = paged_kv(len(lens) * width + 3, bs, hkv, d, seed=d)
    tables = torch.randperm(len(lens) * width + 3, generator=torch.Generator().manual_seed(1))[: len(lens) * width]
    tables = tables.view(len(lens), width)
    q = torch.randn(len(lens), hq, d, generator=torch.Generator().manual_seed(2)) * 3
    out = kernels.paged_decode(q, kc, vc, tables, torch.tensor(lens), d**-0.5)
    assert out.dtype == torch.float32 and out.shape == (len(lens), hq * d)
    for row, n in enumerate(lens):
        torch.testing.assert_close(out[row].double(), reference(q[row], kc, vc, tables[row].tolist(), n), **FP32)


def test_a_rows_bits_do_not_depend_on_the_batch() -> None:
    """Per-context decode: the same row alone, in any batch, at any position, with any threads."""
    kc, vc = paged_kv(64, 16, 3, 64, seed=3)
    gen = torch.Generator().manual_seed(4)
    tables = torch.randperm(64, generator=gen)[:48].view(6, 8)
    lens = torch.tensor([128, 1, 77, 40, 128, 5])
    q = torch.randn(6, 9, 64, generator=gen)
    batch = kernels.paged_decode(q, kc, vc, tables, lens, 0.125)
    threads = torch.get_num_threads()
    try:
        for num_threads in sorted({1, threads}):
            torch.set_num_threads(num_threads)
            for row in range(6):
                alone = kernels.paged_decode(
                    q[row : row + 1], kc, vc, tables[row : row + 1], lens[row : row + 1], 0.125
                )
                assert torch.equal(alone[0], batch[row])
            flipped = kernels.paged_decode(q.flip(0), kc, vc, tables.flip(0), lens.flip(0), 0.125)
            assert torch.equal(flipped.flip(0), batch)
    finally:
        torch.set_num_threads(threads)


def test_strided_queries_nan_rows_and_bad_input() -> None:
    kc, vc = paged_kv(8, 16, 3, 64, seed=5)
    qkv = torch.randn(2, 9 * 64 + 2 * 3 * 64)  # the fused projection's output: q rows are strided
    q = qkv[:, : 9 * 64].view(2, 9, 64)
    tables, lens = torch.tensor([[0, 1], [2, 3]]), torch.tensor([20, 32])
    out = kernels.paged_decode(q, kc, vc, tables, lens, 0.125)
    torch.testing.assert_close(out, kernels.paged_decode(q.contiguous(), kc, vc, tables, lens, 0.125), rtol=0, atol=0)
    kc[3, 0, 1, 5] = float("nan")  # row 1's key 16, KV head 1: its 3 query heads only
    out = kernels.paged_decode(q, kc, vc, tables, lens, 0.125).view(2, 9, 64)
    assert not bool(out[0].isnan().any())
    assert bool(out[1, 3:6].isnan().all()) and not bool(out[1, :3].isnan().any() or out[1, 6:].isnan().any())
    with pytest.raises(ValueError, match="at least one token"):
        kernels.paged_decode(q, kc, vc, tables, torch.tensor([20, 0]), 0.125)
    with pytest.raises(ValueError, match="all bfloat16 or all float32"):
        kernels.paged_decode(q.double(), kc, vc, tables, lens, 0.125)


def test_a_float32_backend_decodes_and_prefills_natively() -> None:
    cache = KVCache(1, 8, 16, 3, 64, torch.float32)
    backend = PagedAttention(cache, 9, 3, 64, native=True)
    assert backend.native and backend.native_prefill
    torch_path = PagedAttention(cache, 9, 3, 64, native=False)
    assert not torch_path.native and not torch_path.native_prefill
    # The rowwise (batch-invariant) backend keeps one arithmetic for decode and prefill rows: torch.
    assert not RowwiseAttention(cache, 9, 3, 64, native=True).native_prefill
    assert not PagedAttention(KVCache(1, 8, 16, 3, 40, torch.float32), 9, 3, 40, native=True).native_prefill  # D % 16
    # A step of two decodes and a prefill chunk after cached tokens: both backends, one answer.
    cache.k.normal_(generator=torch.Generator().manual_seed(6))
    cache.v.normal_(generator=torch.Generator().manual_seed(7))
    seqs = [SeqSpec(1, 20, [0, 1]), SeqSpec(1, 9, [2]), SeqSpec(5, 40, [3, 4, 5])]
    slots = torch.tensor([19, 40, 83, 84, 85, 86, 87])
    gen = torch.Generator().manual_seed(8)
    q, k, v = (
        torch.randn(7, 9, 64, generator=gen),
        torch.randn(7, 3, 64, generator=gen),
        torch.randn(7, 3, 64, generator=gen),
    )
    outs = []
    for b in (backend, torch_path):
        b.prepare(seqs, slots)
        outs.append(b.forward(0, q, k, v))
    assert backend.decode_pieces is not None and torch_path.decode_pieces is None
    torch.testing.assert_close(outs[0], outs[1], **FP32)


def test_rms_norm_and_its_residual_add() -> None:
    gen = torch.Generator().manual_seed(9)
    x, delta, w = (
        torch.randn(13, 576, generator=gen),
        torch.randn(13, 576, generator=gen),
        torch.rand(576, generator=gen),
    )
    with torch.inference_mode():
        torch.testing.assert_close(kernels.rms_norm(x, w, 1e-5), rms_norm_reference(x, w, 1e-5), **FP32)
        r, out = kernels.add_rms_norm(x, delta, w, 1e-5)
        ref_r, ref_out = add_rms_norm_reference(x, delta, w, 1e-5)
    assert torch.equal(r, ref_r)  # one float32 sum: the reference's bits
    torch.testing.assert_close(out, ref_out, **FP32)
    assert not torch.equal(x, r)  # the inputs are not written


def test_rope_has_the_references_bits() -> None:
    cos, sin = cos_sin_table(512, inv_freq(64, 100000.0, None))
    gen = torch.Generator().manual_seed(10)
    qkv = torch.randn(7, 15 * 64, generator=gen)  # q and k heads are a strided view of the projection
    heads = qkv[:, : 12 * 64].view(7, 12, 64)
    positions = torch.tensor([0, 1, 5, 100, 511, 3, 64])
    expected = RotaryStep(positions, cos, sin).apply(heads.clone())
    with torch.inference_mode():
        out = kernels.rope(heads, positions, cos, sin)
    assert out.data_ptr() == heads.data_ptr()  # in place
    assert torch.equal(out, expected)


def test_silu_mul() -> None:
    gate_up = torch.randn(9, 2 * 1536, generator=torch.Generator().manual_seed(11)) * 6
    gate_up[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])
    with torch.inference_mode():
        out = kernels.silu_mul(gate_up)
    torch.testing.assert_close(out, silu_mul_reference(gate_up), **FP32)


def test_a_float32_model_gets_the_elementwise_pieces_and_keeps_its_logits(tiny_model_folder: Path) -> None:
    model, plain = load_model(tiny_model_folder, torch.float32), load_model(tiny_model_folder, torch.float32)
    params = dict(model.named_parameters())
    num = sum(isinstance(m, (RMSNorm, SiluMul, Rotary, DecoderLayer)) for m in model.modules())
    assert kernels.apply_elementwise(model) == num > 0
    swapped = [m for m in model.modules() if isinstance(m, (RMSNorm, SiluMul, Rotary, DecoderLayer))]
    assert all(type(m) in (NativeRMSNorm, NativeSiluMul, NativeRotary, FusedDecoderLayer) for m in swapped)
    assert dict(model.named_parameters()) == params  # the same tensors, not copies
    assert kernels.apply_elementwise(model) == 0  # idempotent
    assert kernels.apply_elementwise(load_model(tiny_model_folder, torch.bfloat16)) == 0  # float32 only
    cfg = model.cfg
    ids = torch.arange(100, 140)

    def logits(m: LlamaModel) -> torch.Tensor:
        cache = KVCache(cfg.num_layers, 4, 16, cfg.num_kv_heads, cfg.head_dim, torch.float32)
        backend = PagedAttention(cache, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
        backend.prepare([SeqSpec(40, 40, [0, 1, 2])], torch.arange(40))
        with torch.inference_mode():
            return m.logits(m(ids, torch.arange(40), backend.forward))

    ours, theirs = logits(model), logits(plain)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
