"""Float32 linears over GGUF blocks (kernels/blocks.py, block_kernels.c): the encoding is recovered
only when it rebuilds every weight bit for bit, the kernels multiply by those very weights, each
row's result does not depend on the other rows, and the transform swaps in exactly the weights
that are such encodings."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from parrot.engine.kernels import apply_batch_invariant, blocks, library, onednn
from parrot.engine.model.layers import Linear, LMHead
from parrot.engine.model.loader import load_model
from tests.engine.block_weights import block_model, q4_1_weight, q8_0_weight

needs_kernels = pytest.mark.skipif(library.blocks_library() is None, reason=library.blocks_status())


def test_a_q4_1_weight_is_recovered_bit_for_bit() -> None:
    w = q4_1_weight(48, 96)
    enc = blocks.encode(w)
    assert enc is not None
    assert enc.kind == "q4_1"
    assert enc.qs.shape == (48, 3, 16)
    assert enc.scales.shape == (48, 3, 2)
    assert torch.equal(enc.dequantize(), w)
    assert enc.nbytes == 48 * 3 * (16 + 8)


def test_a_q8_0_weight_is_recovered_bit_for_bit() -> None:
    w = q8_0_weight(40, 64)
    assert blocks.encode_q4_1(w) is None  # 255 levels in a block: not 4-bit
    enc = blocks.encode(w)
    assert enc is not None
    assert enc.kind == "q8_0"
    assert torch.equal(enc.dequantize(), w)


def test_weights_that_are_no_block_encoding_are_left_alone() -> None:
    gen = torch.Generator().manual_seed(1)
    assert blocks.encode(torch.randn(32, 64, generator=gen)) is None  # float32 noise
    assert blocks.encode(q4_1_weight(8, 64)[:, :48]) is None  # K not a multiple of 32
    assert blocks.encode(q4_1_weight(8, 64).bfloat16()) is None  # not float32
    nudged = q4_1_weight(8, 64)
    nudged[3, 17] = torch.nextafter(nudged[3, 17], torch.tensor(1.0))  # one weight one ulp off
    assert blocks.encode(nudged) is None
    zeros = torch.zeros(4, 32)  # a block with d = 0
    enc = blocks.encode(zeros)
    assert enc is not None
    assert torch.equal(enc.dequantize(), zeros)


@needs_kernels
@pytest.mark.parametrize("make", [q4_1_weight, q8_0_weight], ids=["q4_1", "q8_0"])
def test_the_kernels_multiply_by_the_same_weights_and_rows_do_not_see_each_other(make) -> None:  # type: ignore[no-untyped-def]
    w = make(80, 160, seed=2)
    enc = blocks.encode(w)
    assert enc is not None
    bias = torch.randn(80)
    x = torch.randn(11, 160, generator=torch.Generator().manual_seed(3))
    alone = [blocks.block_linear(x[i : i + 1], enc, bias) for i in range(11)]
    for m in (1, 2, 3, 4, 5, 8, 11):
        y = blocks.block_linear(x[:m], enc, bias)
        torch.testing.assert_close(y, F.linear(x[:m], w, bias), rtol=1e-5, atol=1e-5)
        for i in range(m):  # the same bits whatever the batch around the row
            assert torch.equal(y[i], alone[i][0]), (m, i)
    strided = torch.randn(3, 320)[:, ::2]  # a view whose rows are not contiguous
    torch.testing.assert_close(blocks.block_linear(strided, enc), F.linear(strided, w), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="x has 96 features, weight expects 160"):
        blocks.block_linear(torch.zeros(1, 96), enc)


@needs_kernels
def test_apply_blocks_swaps_the_encoded_weights_and_keeps_the_logits(tiny_model_folder: Path) -> None:
    model = block_model(tiny_model_folder)
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    x = torch.randn(3, linears[0].in_features)
    with torch.no_grad():
        ref_first = F.linear(x, linears[0].weight)
        ref_head = F.linear(x[:, : model.embed.weight.shape[1]], model.embed.weight)
    report = blocks.apply_blocks(model)
    n = len(linears) + 1
    assert report.applied
    assert report.num_replaced == n
    assert report.status.startswith(f"avx2_fma blocks: {n} of {n} weights")
    swapped = [m for m in model.modules() if isinstance(m, Linear)]
    assert all(isinstance(m, blocks.BlockLinear) for m in swapped)
    assert isinstance(model.lm_head, blocks.BlockLMHead)
    assert swapped[0].weight is linears[0].weight  # shared, not copied
    with torch.no_grad():
        torch.testing.assert_close(swapped[0](x), ref_first, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(model.lm_head(x, model.embed.weight), ref_head, rtol=1e-5, atol=1e-5)
    assert blocks.apply_blocks(model).num_replaced == 0  # twice: nothing more


@needs_kernels
def test_a_random_model_keeps_torch_and_says_why(tiny_model_folder: Path) -> None:
    model = load_model(tiny_model_folder, torch.float32)
    report = blocks.apply_blocks(model)
    assert not report.applied
    assert report.status == "unavailable: no weight is an exact Q4_1 or Q8_0 block encoding"
    assert not any(isinstance(m, (blocks.BlockLinear, blocks.BlockLMHead)) for m in model.modules())
    bf16 = load_model(tiny_model_folder, torch.bfloat16)
    assert blocks.apply_blocks(bf16).status == "unavailable: the block kernels take float32 models"


@needs_kernels
def test_big_steps_take_onednn_unless_rows_must_not_see_each_other(tiny_model_folder: Path) -> None:
    model = block_model(tiny_model_folder)
    report = blocks.apply_blocks(model)
    layer = next(m for m in model.modules() if isinstance(m, blocks.BlockLinear))
    x = torch.randn(blocks.MAX_ROWS + 7, layer.in_features)
    packed = layer.packed.get(layer.weight)
    assert (packed is not None) == onednn.available() == (f"oneDNN above {blocks.MAX_ROWS} rows" in report.status)
    with torch.no_grad():
        decode = x[: blocks.MAX_ROWS]
        assert torch.equal(layer(decode), blocks.block_linear(decode, layer.blocks))  # type: ignore[arg-type]
        # A prefill chunk: oneDNN over the prepacked weight (torch's matmul without it).
        expected = F.linear(x, layer.weight) if packed is None else onednn.linear(x, packed)
        assert torch.equal(layer(x), expected)
        torch.testing.assert_close(expected, F.linear(x, layer.weight), rtol=1e-5, atol=1e-5)
    assert apply_batch_invariant(model) > 0
    invariant = next(m for m in model.modules() if isinstance(m, blocks.BlockLinear))
    assert isinstance(invariant, blocks.RowInvariantBlockLinear)
    assert invariant.encoded is layer.encoded  # the encoding is not made again
    assert invariant.packed.packed is None  # ... and oneDNN's copy is dropped: the mode never uses it
    assert isinstance(model.lm_head, blocks.RowInvariantBlockLMHead)
    assert not any(type(m) is Linear or type(m) is LMHead for m in model.modules())
    with torch.no_grad():
        y = invariant(x)
        for i in (0, 5, blocks.MAX_ROWS + 6):
            assert torch.equal(y[i], invariant(x[i : i + 1])[0])
