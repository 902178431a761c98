"""The step descriptor of a fused decoder layer, shared by both libraries' layers (fused.py, bf16:
`parrot_decoder_layer`; fused_f32.py, float32: `parrot_decoder_layer_f32`), whose sequence is one
C source, csrc/decoder_layer.h.

The descriptor is an int64 tensor: the slots every layer reads (`ST_*` of csrc/decoder_layer.h:
the step's shapes, cache slots, rotary tables, caches, scratch and thread count), then the
attention's own slots, which each library's `StepDescriptor` subclass supplies.

Ownership: one `StepDescriptor` per model, shared by its fused layers, holds the step's
descriptor, scratch and two output buffers from the first layer of a forward pass to its last
(layer i writes outs[i % 2], which layer i + 2 overwrites: the model's loop holds only the
latest; the last layer's outputs stay valid after the pass).
"""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

import torch

from parrot.engine.model.config import ModelConfig
from parrot.engine.model.rope import RotaryStep


class StepRows(Protocol):
    """What a step's attention hands a fused layer (NativeRows, Float32DecodeRows): the caches and
    the rows' new K/V slots, valid for its step."""

    @property
    def k_cache(self) -> torch.Tensor: ...  # [layers, blocks, block_size, Hkv, D]

    @property
    def v_cache(self) -> torch.Tensor: ...

    @property
    def slot_mapping(self) -> torch.Tensor: ...  # [N] int64


RowsT = TypeVar("RowsT", bound=StepRows)


def layer_buffers(cfg: ModelConfig, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A fused layer's scratch for a step of n rows (qkv, attention, residual, normed, gate/up, act
    and delta, in the order csrc/decoder_layer.h lays them out: n * (W + Hq*D + 3 hidden + 3 inter),
    W = (Hq + 2 Hkv) * D) and its two output buffers [2, 2, n, hidden] (layer i writes [i % 2])."""
    hq, d, hidden = cfg.num_heads, cfg.head_dim, cfg.hidden_size
    width = (hq + 2 * cfg.num_kv_heads) * d
    scratch = torch.empty(n * (width + hq * d + 3 * hidden + 3 * cfg.intermediate_size), dtype=dtype)
    return scratch, torch.empty(2, 2, n, hidden, dtype=dtype)


class StepDescriptor(Generic[RowsT]):
    """The step descriptor and buffers, shared by a model's fused layers. Subclasses say which
    steps their kernel takes (`takes`) and fill the attention's slots (`attention_fields`)."""

    DTYPE: torch.dtype

    def __init__(self) -> None:
        self.key: tuple[RotaryStep, RowsT] | None = None  # held: identity is the step's
        self.desc: torch.Tensor | None = None  # None: this step runs per op
        self.held: list[torch.Tensor] = []  # what desc points into
        self.outs: list[tuple[torch.Tensor, torch.Tensor]] = []  # layer i writes outs[i % 2]
        self.out_ptrs: list[tuple[int, int]] = []

    def get(self, cfg: ModelConfig, rotary: RotaryStep, rows: RowsT, n: int) -> torch.Tensor | None:
        """The descriptor of the step of n rows that `rotary` and `rows` describe, built by its first
        layer, or None where the kernel does not take the step."""
        if self.key is not None and self.key[0] is rotary and self.key[1] is rows:
            return self.desc
        self.release()
        self.key = (rotary, rows)
        if not self.takes(cfg, rotary, rows, n):
            return None
        scratch, outs = layer_buffers(cfg, n, self.DTYPE)
        self.outs = [(outs[i, 0], outs[i, 1]) for i in range(2)]
        self.out_ptrs = [(x.data_ptr(), h.data_ptr()) for x, h in self.outs]
        k = rows.k_cache
        fields = [n, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size]
        fields += [rows.slot_mapping.data_ptr(), rotary.positions.data_ptr(), rotary.cos_table.data_ptr()]
        fields += [rotary.sin_table.data_ptr(), k.data_ptr(), rows.v_cache.data_ptr(), k[0].numel(), k.shape[2]]
        fields += [scratch.data_ptr(), torch.get_num_threads()]
        attention, held = self.attention_fields(cfg, rows)
        self.held = [scratch, outs, *held]
        self.desc = torch.tensor(fields + attention, dtype=torch.int64)
        return self.desc

    def release(self) -> None:
        """Forget the step (the next layer call builds the next one); outputs already returned
        stay valid."""
        self.key, self.desc, self.held, self.outs, self.out_ptrs = None, None, [], [], []

    def takes(self, cfg: ModelConfig, rotary: RotaryStep, rows: RowsT, n: int) -> bool:
        raise NotImplementedError

    def attention_fields(self, cfg: ModelConfig, rows: RowsT) -> tuple[list[int], list[torch.Tensor]]:
        """The attention's slots (after the shared ones) and the tensors they point into."""
        raise NotImplementedError
