"""Row-wise attention ("rowwise"): every row of the step, decode or prefill, attends to its own
sequence's KV from position 0 with one fixed per-row arithmetic, so its result depends only on
its query and its sequence's keys, never on the batch, on how the prompt was chunked, on whether
the prefix was forked, or on whether a token was generated or filled (the attention of the
batch-invariant mode, `EngineConfig.batch_invariant`).

Why not the other backends there: a prompt token reaches `PagedAttention` as a prefill row (SDPA
over its chunk) or, when a chunk holds one token after cached ones, as a decode row (another
kernel, another rounding); and the shared-prefix cascade splits a row's keys where its group's
shared prefix ends (which depends on the other rows) and merges the parts by log-sum-exp.

Native: the leading one-token rows (decodes) on `kernels.paged_decode`, each prefill chunk on
`kernels.paged_prefill`; both run the same per-row arithmetic (keys in 64-token tiles from
position 0, an online softmax), so which kernel a row takes is a speed choice, not a numeric one
(the chunk kernel reads each tile once for all its rows). Torch fallback (no native kernels, or a
float32 cache: its native decode has no prefill kernel of the same arithmetic): SDPA one row at a
time over exactly its own keys (slow, but the same shape for the same length).
Ownership: the step's row tables, lengths and chunks are built in `prepare`, valid for that step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from parrot.engine import kernels
from parrot.engine.attention.base import PagedAttention, SeqSpec, gather_blocks, padded_tables
from parrot.engine.kv.cache import KVCache


class RowwiseAttention(PagedAttention):
    name = "rowwise"

    def __init__(self, cache: KVCache, num_heads: int, num_kv_heads: int, head_dim: int, native: bool = False) -> None:
        super().__init__(cache, num_heads, num_kv_heads, head_dim, native)
        # Decode and prefill rows must share one arithmetic: the chunk kernel only where it does.
        self.native_prefill = self.native_prefill and kernels.prefill_matches_decode(cache.k)

    def prepare(self, seqs: list[SeqSpec], slot_mapping: torch.Tensor) -> None:
        self.slot_mapping = slot_mapping
        self.num_decode, self.prefills = 0, []
        self.seqs = seqs
        bs = self.cache.block_size
        num_rows = sum(s.num_new for s in seqs)
        max_blocks = max((-(-s.seq_len // bs) for s in seqs), default=0)
        # The leading one-row sequences (the decodes) from plain lists, in one copy each.
        num_ones = next((i for i, s in enumerate(seqs) if s.num_new != 1), len(seqs))
        tables = torch.zeros(num_rows, max_blocks, dtype=torch.long)
        lens = torch.empty(num_rows, dtype=torch.long)
        if num_ones:
            tables[:num_ones] = torch.tensor(padded_tables(seqs[:num_ones], max_blocks, bs), dtype=torch.long)
            lens[:num_ones] = torch.tensor([s.seq_len for s in seqs[:num_ones]], dtype=torch.long)
        row = num_ones
        for s in seqs[num_ones:]:
            num_blocks = -(-s.seq_len // bs)
            rows = slice(row, row + s.num_new)
            tables[rows, :num_blocks] = torch.tensor(s.block_table[:num_blocks], dtype=torch.long)
            torch.arange(s.seq_len - s.num_new + 1, s.seq_len + 1, out=lens[rows])
            row += s.num_new
        self.row_tables = tables  # [N, max_blocks]: row i's sequence's block table
        self.row_lens = lens  # [N]: row i attends to keys [0, row_lens[i])
        self.num_decode = num_ones  # rows one by one on paged_decode; then each sequence a chunk
        chunks, row = [], num_ones
        for s in seqs[num_ones:]:
            chunks.append((row, s.num_new, s.seq_len))
            row += s.num_new
        self.chunk_list = chunks  # (first row, rows, sequence length): read by every layer's forward
        self.chunks = torch.tensor(chunks, dtype=torch.long).reshape(-1, 3)
        k, v = self.cache.k, self.cache.v  # fused layers may take any step natively
        self.rows = (
            kernels.NativeRows(k, v, slot_mapping, tables, lens, self.scale, self.chunks)
            if self.native_prefill
            else None
        )

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [N, Hq, D], k/v [N, Hkv, D] -> [N, Hq * D]."""
        self.cache.write(layer, self.slot_mapping, k, v)
        k_cache, v_cache = self.cache.k[layer], self.cache.v[layer]
        out = torch.empty(q.shape[0], self.num_heads * self.head_dim, dtype=q.dtype, device=q.device)
        if self.native_prefill:  # bf16: decode and prefill rows on the kernels' one arithmetic
            nd = self.num_decode
            if nd:
                out[:nd] = kernels.paged_decode(
                    q[:nd], k_cache, v_cache, self.row_tables[:nd], self.row_lens[:nd], self.scale
                )
            for first, n, seq_len in self.chunk_list:
                rows = slice(first, first + n)
                out[rows] = kernels.paged_prefill(
                    q[rows], k_cache, v_cache, self.row_tables[first], seq_len, self.scale
                )
            return out
        bs, hkv, d = self.cache.block_size, self.num_kv_heads, self.head_dim
        row = 0
        for s in self.seqs:
            ids = torch.tensor(s.block_table[: -(-s.seq_len // bs)], dtype=torch.long)
            keys = gather_blocks(k_cache, ids).transpose(0, 1)  # [Hkv, blocks * bs, D]
            vals = gather_blocks(v_cache, ids).transpose(0, 1)
            for pos in range(s.seq_len - s.num_new, s.seq_len):
                # The G query heads of one KV head attend as G query rows over exactly pos + 1 keys.
                qg = q[row].reshape(1, hkv, self.num_groups, d)
                o = F.scaled_dot_product_attention(
                    qg, keys[None, :, : pos + 1], vals[None, :, : pos + 1], scale=self.scale
                )
                out[row] = o.reshape(-1)
                row += 1
        return out
