"""oneDNN's float32 matmul over prepacked weights, through torch's mkldnn ops: the float32
engine's projections and LM head for steps above the block kernels' `blocks.MAX_ROWS` (prefill
chunks).

torch's `F.linear` in float32 calls MKL's sgemm on the unpacked weight; oneDNN with the weight
reordered once into its blocked layout (`torch.ops.mkldnn._reorder_linear_weight`, the op torch's
own compiler uses for CPU linears) runs 1.2-1.9x faster at 64-512 rows on the AVX2-only EPYC (a
prefill to first token 1.15-1.18x in an engine). On a weight in cache it also beats the block
kernels from 8 rows, but a decode step reads each weight once from memory, 4 bytes a weight here
against their 0.6, and such steps are slower in an engine (blocks.py). The packed copy costs the
float32 weight's size again in memory (513 MB for the default model), made at load. The ops are
torch internals, pinned with torch: where they are missing, `pack` returns None and callers keep
`F.linear`.
"""

from __future__ import annotations

import torch


def available() -> bool:
    ops = torch.ops.mkldnn
    return torch.backends.mkldnn.is_available() and hasattr(ops, "_reorder_linear_weight")


def pack(weight: torch.Tensor) -> torch.Tensor | None:
    """`weight` [N, K] (float32, CPU) in oneDNN's blocked layout, or None where oneDNN cannot take it."""
    if weight.dtype != torch.float32 or weight.dim() != 2 or weight.device.type != "cpu" or not available():
        return None
    try:
        with torch.no_grad():
            return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous())
    except RuntimeError:
        return None


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ w^T (+ bias) for x [M, K] float32 and w packed by `pack` (inference only)."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")


def nbytes(packed: torch.Tensor) -> int:
    """The packed weight's size (an opaque oneDNN tensor: its logical float32 size)."""
    return packed.numel() * 4
