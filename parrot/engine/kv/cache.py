"""The KV cache tensors: one K and one V tensor per layer, laid out as paged blocks.

Owned by the model runner (engine loop thread). Shapes: k[layer], v[layer] are
[num_blocks, block_size, num_kv_heads, head_dim]; a flat slot id is block * block_size + offset.
Zero-initialised so that masked-out slots never hold NaN.
"""

from __future__ import annotations

import torch

from parrot.engine.kv.context import BlockCopy


class KVCache:
    def __init__(
        self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> None:
        shape = (num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype)
        self.v = torch.zeros(shape, dtype=dtype)
        self.block_size = block_size
        self.num_blocks = num_blocks

    @staticmethod
    def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * block_size * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()

    def write(self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [N, Hkv, D] go to flat slots slot_mapping [N]."""
        self.k[layer].view(-1, *k.shape[1:]).index_copy_(0, slot_mapping, k)
        self.v[layer].view(-1, *v.shape[1:]).index_copy_(0, slot_mapping, v)

    def copy_blocks(self, copies: list[BlockCopy]) -> None:
        """Apply copy-on-write copies (all layers), before the step that writes those blocks."""
        for c in copies:
            self.k[:, c.dst, : c.num_slots] = self.k[:, c.src, : c.num_slots]
            self.v[:, c.dst, : c.num_slots] = self.v[:, c.src, : c.num_slots]
