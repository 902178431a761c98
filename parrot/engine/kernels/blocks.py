"""Float32 models over their GGUF blocks: the exact block encoding of a dequantized weight, and the
pieces that multiply by it (block_kernels.c, AVX2 + FMA).

A GGUF model is dequantized once to float32 (model/loader.py); on a CPU without bfloat16 arithmetic
the engine runs it in float32, and a decode step streams every weight as 4 bytes. But each weight
is still `d * q + m` of its 4-bit block (Q4_1) or `d * q` of its 8-bit one (Q8_0): `encode_q4_1` and
`encode_q8_0` recover (d, m, q) from the float32 weight and keep them only if every weight is
rebuilt bit for bit, so the kernels multiply by exactly the model's float32 weights while reading
0.6 or 1.06 bytes a weight. A weight that is not such an encoding (a model shipped in float32, a
random test model) keeps torch's path.

`BlockLinear` and `BlockLMHead` run steps of up to `MAX_ROWS` rows on the kernels and bigger ones
(prefill chunks) on oneDNN over a prepacked copy of the weight (onednn.py; torch's matmul without
it), which wins there. Their `ROW_INVARIANT`
versions (the batch-invariant mode) run every row count on the kernels, whose per-row sum does not
depend on the other rows. `apply_blocks(model)` swaps them in for a float32 model's projections and
LM head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Self

import torch
import torch.nn.functional as F
from torch import nn

from parrot.engine.kernels import library, onednn
from parrot.engine.kernels.pieces import PackedWeight, head_sharing, linear_sharing
from parrot.engine.model.layers import Linear, LMHead

QK = 32  # weights per block
# Up to here the kernels: they read 0.6 bytes a weight where torch's matmul and oneDNN read 4, and
# a decode step reads each weight once, from memory. In one engine by turns (AVX2 EPYC, 2 threads,
# medians of 5), oneDNN from 8 rows makes decode steps slower (8 rows x 450 tokens 116 against 85
# ms, 16 x 200 137 against 109, 32 x 200 194 against 188) though it wins on weights in cache
# (gate_up at 16 rows 537 us against 824); bigger steps are faster on it: decode steps of 48 / 56 /
# 64 rows 160 / 187 / 200 ms against 189 / 199 / 268, 40 rows even (`benchmarks.engine.kernels
# --float32-ab rows`, 48-token prompts, medians of 6).
MAX_ROWS = 40
MAX_K = 8192  # the kernels' buffer of rebuilt weights holds 4 columns of this many
_STEPS = (0, 1, -1, 2, -2)  # half-float steps around the estimated scale tried for a block


@dataclass(frozen=True)
class BlockWeight:
    """A [N, K] weight as blocks of 32 along K: `qs` the codes, `scales` (d, m) or d per block."""

    kind: str  # "q4_1" or "q8_0"
    qs: torch.Tensor  # q4_1: uint8 [N, K/32, 16] (byte j: q[j] | q[j + 16] << 4); q8_0: int8 [N, K/32, 32]
    scales: torch.Tensor  # float32: q4_1 [N, K/32, 2] (d, m); q8_0 [N, K/32]
    out_features: int
    in_features: int

    @property
    def nbytes(self) -> int:
        return self.qs.numel() * self.qs.element_size() + self.scales.numel() * 4

    def dequantize(self) -> torch.Tensor:
        """The float32 weight, rebuilt as the kernels rebuild it (tests compare it with the original)."""
        if self.kind == "q8_0":
            return (self.qs.float() * self.scales[..., None]).reshape(self.out_features, self.in_features)
        q = torch.cat([self.qs & 0x0F, self.qs >> 4], dim=-1).float()
        w = self.scales[..., :1] * q + self.scales[..., 1:]
        return w.reshape(self.out_features, self.in_features)


def _half_steps(estimate: torch.Tensor) -> list[torch.Tensor]:
    """Candidate half-float scales: the estimate rounded to half, and its neighbours."""
    bits = estimate.to(torch.float16).view(torch.int16).to(torch.int32)
    return [(bits + s).clamp(0, 0x7BFF).to(torch.int16).view(torch.float16).float() for s in _STEPS]


def _blocks(weight: torch.Tensor) -> torch.Tensor | None:
    """The weight as [blocks, 32] (float32, K a multiple of 32), or None."""
    if weight.dim() != 2 or weight.dtype != torch.float32 or weight.shape[1] % QK or weight.numel() == 0:
        return None
    return weight.detach().reshape(-1, QK)


def _solve(
    b: torch.Tensor, estimate: torch.Tensor, offset: torch.Tensor | None, lo: int, hi: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(d, q) with fp32(d * q) (+ offset) == b for every block, d a half float, q in lo..hi; each
    candidate scale is tried only on the blocks no earlier one rebuilt. None if a block is left."""
    d = torch.zeros(b.shape[0])
    q = torch.zeros(b.shape, dtype=torch.int16)
    left = torch.arange(b.shape[0])
    target = b if offset is None else b - offset[:, None]
    for step in range(len(_STEPS)):
        c = _half_steps(estimate[left])[step][:, None]
        safe = torch.where(c > 0, c, 1.0)
        qc = torch.where(c > 0, target[left] / safe, 0.0).round_().clamp_(lo, hi)
        rebuilt = c * qc if offset is None else c * qc + offset[left, None]
        good = (rebuilt == b[left]).all(-1)
        d[left[good]] = c[good, 0]
        q[left[good]] = qc[good].to(torch.int16)
        left = left[~good]
        if not len(left):
            return d, q
    return None


def encode_q4_1(weight: torch.Tensor) -> BlockWeight | None:
    """`weight` as Q4_1 blocks (w = d * q + m, d and m half floats, q in 0..15) if it is exactly
    one, else None. The block's least weight is m (its code is 0)."""
    b = _blocks(weight)
    if b is None:
        return None
    m = b.amin(-1)
    if not torch.equal(m.half().float(), m):
        return None
    solved = _solve(b, (b.amax(-1) - m) / 15, m, 0, 15)
    if solved is None:
        return None
    d, q8 = solved
    n, k = weight.shape
    q = q8.to(torch.uint8).reshape(n, k // QK, QK)
    packed = q[..., :16] | (q[..., 16:] << 4)
    scales = torch.stack([d, m], dim=-1).reshape(n, k // QK, 2)
    return BlockWeight("q4_1", packed.contiguous(), scales.contiguous(), n, k)


def encode_q8_0(weight: torch.Tensor) -> BlockWeight | None:
    """`weight` as Q8_0 blocks (w = d * q, d a half float, q in -127..127) if it is exactly one."""
    b = _blocks(weight)
    if b is None:
        return None
    solved = _solve(b, b.abs().amax(-1) / 127, None, -127, 127)
    if solved is None:
        return None
    d, q = solved
    n, k = weight.shape
    return BlockWeight("q8_0", q.to(torch.int8).reshape(n, k // QK, QK).contiguous(), d.reshape(n, k // QK), n, k)


def encode(weight: torch.Tensor) -> BlockWeight | None:
    """The weight's exact block encoding (Q4_1 first: it is the smaller), or None."""
    return encode_q4_1(weight) or encode_q8_0(weight)


def block_linear(x: torch.Tensor, blocks: BlockWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ w^T (+ bias) on the block kernels; x float32 [M, K] with unit stride along K."""
    lib = library.blocks_library()
    assert lib is not None
    m, k = x.shape
    if k != blocks.in_features:
        raise ValueError(f"linear: x has {k} features, weight expects {blocks.in_features}")
    if x.stride(1) != 1:
        x = x.contiguous()
    y = torch.empty(m, blocks.out_features, dtype=torch.float32)
    fn = lib.parrot_linear_q4_1 if blocks.kind == "q4_1" else lib.parrot_linear_q8_0
    if bias is not None:
        bias = bias.contiguous()  # held until the call returns
    bias_ptr = None if bias is None else bias.data_ptr()
    fn(
        x.data_ptr(),
        x.stride(0),
        blocks.qs.data_ptr(),
        blocks.scales.data_ptr(),
        bias_ptr,
        y.data_ptr(),
        m,
        blocks.out_features,
        k,
        torch.get_num_threads(),
    )
    return y


def _linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    encoded: PackedWeight[BlockWeight],
    packed: PackedWeight[torch.Tensor],
    row_invariant: bool,
) -> torch.Tensor:
    """x @ weight^T (+ bias) on the block kernels (small steps, or every step when
    `row_invariant`), oneDNN (bigger ones) or torch (anything else: autograd, another dtype)."""
    ours = x.dim() == 2 and x.dtype == torch.float32 and x.device.type == "cpu" and not torch.is_grad_enabled()
    blocks = encoded.get(weight)
    if ours and blocks is not None and blocks.in_features <= MAX_K and (row_invariant or x.shape[0] <= MAX_ROWS):
        return block_linear(x, blocks, bias)
    prepacked = packed.get(weight) if ours and not row_invariant else None
    if prepacked is not None:
        return onednn.linear(x, prepacked, bias)
    return F.linear(x, weight, bias)


class BlockLinear(Linear):
    """A projection whose float32 weight is an exact block encoding: small steps on the kernels."""

    ROW_INVARIANT = False

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.encoded: PackedWeight[BlockWeight] = PackedWeight(encode, torch.float32)
        self.packed: PackedWeight[torch.Tensor] = PackedWeight(onednn.pack, torch.float32)  # oneDNN's

    @classmethod
    def of(cls, linear: Linear) -> Self:
        new = linear_sharing(cls, linear)
        if isinstance(linear, BlockLinear):
            new.encoded = linear.encoded  # the same weight: its encoding is not made again
            if not cls.ROW_INVARIANT:  # (the row-invariant pieces never use oneDNN: its copy goes)
                new.packed = linear.packed
        return new

    @property
    def blocks(self) -> BlockWeight | None:
        return self.encoded.get(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _linear(x, self.weight, self.bias, self.encoded, self.packed, self.ROW_INVARIANT)


class BlockLMHead(LMHead):
    ROW_INVARIANT = False

    def __init__(self, hidden_size: int, vocab_size: int, tied: bool) -> None:
        super().__init__(hidden_size, vocab_size, tied)
        self.encoded: PackedWeight[BlockWeight] = PackedWeight(encode, torch.float32)
        self.packed: PackedWeight[torch.Tensor] = PackedWeight(onednn.pack, torch.float32)

    @classmethod
    def of(cls, head: LMHead) -> Self:
        new = head_sharing(cls, head)
        if isinstance(head, BlockLMHead):
            new.encoded = head.encoded
            if not cls.ROW_INVARIANT:
                new.packed = head.packed
        return new

    def forward(self, hidden: torch.Tensor, embed_weight: torch.Tensor) -> torch.Tensor:
        w = self.head_weight(embed_weight)
        return _linear(hidden, w, None, self.encoded, self.packed, self.ROW_INVARIANT)


class RowInvariantBlockLinear(BlockLinear):
    ROW_INVARIANT = True


class RowInvariantBlockLMHead(BlockLMHead):
    ROW_INVARIANT = True


@dataclass(frozen=True)
class BlocksReport:
    """What `apply_blocks` did: `status` is what EngineStats.native_kernels reports."""

    status: str  # "avx2_fma blocks: N of M weights (X MB for Y MB of float32)" or "unavailable: <reason>"
    num_replaced: int = 0

    @property
    def applied(self) -> bool:
        return self.num_replaced > 0


def apply_blocks(model: nn.Module) -> BlocksReport:
    """Swap a float32 model's projections and LM head, in place, for block pieces where their weight
    is an exact block encoding (encoded now, once, and packed for oneDNN where it runs); leave the
    rest, and say why when nothing is. (`apply_batch_invariant` then swaps them for their
    row-invariant versions, keeping the encodings.)"""
    if {p.dtype for p in model.parameters()} != {torch.float32}:
        return BlocksReport("unavailable: the block kernels take float32 models")
    if library.blocks_library() is None:
        return BlocksReport(library.blocks_status())
    linear, head = BlockLinear, BlockLMHead
    embed = getattr(model, "embed", None)
    num_replaced = num_weights = encoded_bytes = float_bytes = packed_bytes = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, Linear) and not isinstance(child, linear):
                new: BlockLinear | BlockLMHead = linear.of(child)
                weight = child.weight
            elif isinstance(child, LMHead) and not isinstance(child, head) and isinstance(embed, nn.Embedding):
                new = head.of(child)
                weight = child.head_weight(embed.weight)
            else:
                continue
            num_weights += 1
            blocks = new.encoded.get(weight)
            if blocks is None:
                continue
            new.train(child.training)
            setattr(parent, name, new)
            num_replaced += 1
            encoded_bytes += blocks.nbytes
            float_bytes += weight.numel() * 4
            packed = new.packed.get(weight)  # at load, not in the first big step
            packed_bytes += 0 if packed is None else onednn.nbytes(packed)
    if not num_replaced:
        return BlocksReport("unavailable: no weight is an exact Q4_1 or Q8_0 block encoding")
    mb = 1 << 20
    status = (
        f"{library.blocks_status()} blocks: {num_replaced} of {num_weights} weights "
        f"({encoded_bytes / mb:.0f} MB for {float_bytes / mb:.0f} MB of float32)"
    )
    if packed_bytes:
        status += f", oneDNN above {MAX_ROWS} rows ({packed_bytes / mb:.0f} MB packed)"
    return BlocksReport(status, num_replaced)
