"""The decoder's swappable pieces in plain torch: projections, RMSNorm (with the residual add),
SiLU*up and the LM head. Their numerics are the reference (transformers' op order and rounding).

Each piece is a small module so that a transform can replace it in a finished model with a
subclass of the same contract (`parrot.engine.kernels.apply_native` swaps in native CPU kernels);
the model never asks whether it was transformed. This file imports only torch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim in the reference implementation's exact op order (transformers'
    LlamaRMSNorm): F.rms_norm rounds differently in bf16, and on the default model that flips
    greedy answers."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def add_rms_norm_reference(
    x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(r, rms_norm(r)) with r = x + delta (rounded once to x's dtype)."""
    r = x + delta
    return r, rms_norm_reference(r, weight, eps)


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """[N, 2I] = [gate | up] -> silu(gate) * up [N, I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class Linear(nn.Linear):
    """nn.Linear as the model's own type, so a transform finds exactly the model's projections."""


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm_reference(x, self.weight, self.eps)

    def add_and_norm(self, x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual add before this norm and the norm: (x + delta, norm(x + delta))."""
        return add_rms_norm_reference(x, delta, self.weight, self.eps)


class SiluMul(nn.Module):
    """The MLP's activation over the fused gate/up projection: [N, 2I] -> silu(gate) * up [N, I]."""

    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        return silu_mul_reference(gate_up)


class LMHead(nn.Module):
    """hidden [N, hidden] -> logits [N, vocab] in the model's dtype. With tied embeddings the head
    has no weight of its own and multiplies by the input embedding's (passed in by the model)."""

    def __init__(self, hidden_size: int, vocab_size: int, tied: bool) -> None:
        super().__init__()
        self.weight: nn.Parameter | None
        self.register_parameter("weight", None if tied else nn.Parameter(torch.empty(vocab_size, hidden_size)))

    def head_weight(self, embed_weight: torch.Tensor) -> torch.Tensor:
        return embed_weight if self.weight is None else self.weight

    def forward(self, hidden: torch.Tensor, embed_weight: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.head_weight(embed_weight))
