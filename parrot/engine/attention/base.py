"""Attention backends: the per-step metadata and the per-layer forward over the paged KV cache.

A backend is told the step's sequences once (`prepare`), then called once per layer (`forward`).
Rows of a step are laid out decode-first: rows [0, num_decode) are one new token of each decoding
sequence, then each prefill chunk's rows in order. The backend writes the new K/V into the cache
and returns the attention output for every row.

`PagedAttention` is the per-context reference path: every sequence reads all of its own KV.
Subclasses change how decode rows are attended (e.g. shared-prefix attention) and keep the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from parrot.engine.kv.cache import KVCache


@dataclass(frozen=True)
class SeqSpec:
    """One scheduled sequence of the step: `num_new` tokens ending at length `seq_len`."""

    num_new: int
    seq_len: int
    block_table: list[int]


@dataclass
class PrefillMeta:
    row_start: int
    num_new: int
    seq_len: int
    block_ids: torch.Tensor  # [ceil(seq_len / block_size)]
    mask: torch.Tensor  # [G*T, S] bool, bottom-right causal (rows ordered (g, t))


class PagedAttention:
    name = "paged"

    def __init__(self, cache: KVCache, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        self.cache = cache
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.num_groups = num_heads // num_kv_heads
        self.scale = head_dim**-0.5
        self.slot_mapping = torch.empty(0, dtype=torch.long)
        self.num_decode = 0
        self.prefills: list[PrefillMeta] = []

    # ---- per step -------------------------------------------------------------------------
    def prepare(self, seqs: list[SeqSpec], slot_mapping: torch.Tensor) -> None:
        """Build the step's metadata once. `seqs` are in row order (decodes first)."""
        self.slot_mapping = slot_mapping
        bs = self.cache.block_size
        num_decode = 0
        while num_decode < len(seqs) and seqs[num_decode].num_new == 1 and _is_decode(seqs[num_decode]):
            num_decode += 1
        self.num_decode = num_decode
        self.prepare_decode(seqs[:num_decode])
        self.prefills = []
        row = num_decode
        g = self.num_groups
        for s in seqs[num_decode:]:
            num_blocks = -(-s.seq_len // bs)
            past = s.seq_len - s.num_new
            cols = torch.arange(s.seq_len)
            rows = torch.arange(s.num_new)[:, None]
            mask = (cols[None, :] <= rows + past).repeat(g, 1)
            ids = torch.tensor(s.block_table[:num_blocks], dtype=torch.long)
            self.prefills.append(PrefillMeta(row, s.num_new, s.seq_len, ids, mask))
            row += s.num_new

    def prepare_decode(self, seqs: list[SeqSpec]) -> None:
        if not seqs:
            return
        bs = self.cache.block_size
        max_blocks = max(-(-s.seq_len // bs) for s in seqs)
        tables = torch.zeros(len(seqs), max_blocks, dtype=torch.long)
        for i, s in enumerate(seqs):
            n = -(-s.seq_len // bs)
            tables[i, :n] = torch.tensor(s.block_table[:n], dtype=torch.long)
        lens = torch.tensor([s.seq_len for s in seqs])
        self.decode_tables = tables  # [B, max_blocks]
        # [B, 1, 1, max_blocks * bs]: True where the slot holds this sequence's KV.
        self.decode_mask = (torch.arange(max_blocks * bs)[None, :] < lens[:, None])[:, None, None, :]

    # ---- per layer ------------------------------------------------------------------------
    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [N, Hq, D], k/v [N, Hkv, D] -> [N, Hq * D]."""
        self.cache.write(layer, self.slot_mapping, k, v)
        n = q.shape[0]
        out = torch.empty(n, self.num_heads * self.head_dim, dtype=q.dtype)
        if self.num_decode:
            out[: self.num_decode] = self.decode(layer, q[: self.num_decode])
        for p in self.prefills:
            rows = slice(p.row_start, p.row_start + p.num_new)
            out[rows] = self.prefill(layer, p, q[rows], k[rows], v[rows])
        return out

    def decode(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """q [B, Hq, D] -> [B, Hq * D]; each row attends to its whole own KV."""
        b = q.shape[0]
        kc, vc = self.cache.k[layer], self.cache.v[layer]
        # Gather each sequence's blocks: [B, nb, bs, Hkv, D] -> [B, Hkv, nb*bs, D].
        keys = kc[self.decode_tables].flatten(1, 2).transpose(1, 2)
        vals = vc[self.decode_tables].flatten(1, 2).transpose(1, 2)
        # The G query heads of one KV head attend as G query rows: no KV repeat.
        qg = q.view(b, self.num_kv_heads, self.num_groups, self.head_dim)
        o = F.scaled_dot_product_attention(qg, keys, vals, attn_mask=self.decode_mask, scale=self.scale)
        return o.reshape(b, -1)

    def prefill(self, layer: int, p: PrefillMeta, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """One chunk of T new tokens after S-T cached ones: q [T, Hq, D] -> [T, Hq * D]."""
        t, hkv, g, d = p.num_new, self.num_kv_heads, self.num_groups, self.head_dim
        if p.seq_len == p.num_new:
            keys, vals = k, v  # nothing cached before this chunk: attend to the new tokens only
        else:
            keys = self.cache.k[layer][p.block_ids].flatten(0, 1)[: p.seq_len]
            vals = self.cache.v[layer][p.block_ids].flatten(0, 1)[: p.seq_len]
        keys, vals = keys.transpose(0, 1), vals.transpose(0, 1)  # [Hkv, S, D]
        # [T, Hkv, G, D] -> [Hkv, G*T, D]: rows ordered (g, t), matching the mask's repeat.
        qg = q.view(t, hkv, g, d).permute(1, 2, 0, 3).reshape(hkv, g * t, d)
        o = F.scaled_dot_product_attention(qg, keys, vals, attn_mask=p.mask, scale=self.scale)
        return o.view(hkv, g, t, d).permute(2, 0, 1, 3).reshape(t, hkv * g * d)


def _is_decode(s: SeqSpec) -> bool:
    """A one-token step of a sequence with KV before it (a 1-token prompt is a prefill)."""
    return s.seq_len > 1
