"""Rotary position embedding: its tables (with the scaling variants of LLaMA-family configs) and
the model's `Rotary` piece, which a transform may swap (see model/layers.py). Imports only torch."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


def inv_freq(head_dim: int, theta: float, scaling: dict[str, Any] | None) -> torch.Tensor:
    """Inverse frequencies [head_dim/2] in float32, after the config's rope scaling."""
    freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    kind = (scaling or {}).get("rope_type") or (scaling or {}).get("type")
    if not scaling or kind in (None, "default"):
        return freq
    if kind == "linear":
        return freq / float(scaling["factor"])
    if kind == "llama3":
        factor = float(scaling["factor"])
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_len = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / freq
        low_wavelen, high_wavelen = old_len / low, old_len / high
        scaled = torch.where(wavelen > low_wavelen, freq / factor, freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        mid = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(mid, smoothed, scaled)
    raise ValueError(f"unsupported rope_scaling type {kind!r}")


def cos_sin_table(max_len: int, freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin tables [max_len, head_dim] in float32 (the half-frequencies repeated twice)."""
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]
    angles = pos * freq[None, :]
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, heads, head_dim]; cos/sin [N, 1, head_dim] in x's dtype."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class RotaryStep:
    """The rotary embedding at one step's `positions` [N], from fp32 tables [max_len, D] (rounded to
    x's dtype first, as the reference does). Built once per forward pass and applied in every
    layer; the tables are gathered once per step and dtype."""

    def __init__(self, positions: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor) -> None:
        self.positions, self.cos_table, self.sin_table = positions, cos_table, sin_table
        self._gathered: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, heads, D] (rows may be strided, e.g. a view into the qkv projection) -> rotated."""
        if x.dtype not in self._gathered:
            pos = self.positions
            cos = self.cos_table[pos].to(x.dtype).unsqueeze(1)
            self._gathered[x.dtype] = (cos, self.sin_table[pos].to(x.dtype).unsqueeze(1))
        return apply_rope(x, *self._gathered[x.dtype])


class Rotary(nn.Module):
    """Owns the fp32 cos/sin tables [max_len, D] (buffers, not saved) and makes each step's
    `RotaryStep`."""

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(self, cos: torch.Tensor, sin: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def at(self, positions: torch.Tensor) -> RotaryStep:
        return RotaryStep(positions, self.cos, self.sin)
