"""Attention backends: the per-step metadata and the per-layer forward over the paged KV cache.

A backend is told the step's sequences once (`prepare`), then called once per layer (`forward`).
Rows of a step are laid out decode-first: rows [0, num_decode) are one new token of each decoding
sequence, then each prefill chunk's rows in order. The backend writes the new K/V into the cache
and returns the attention output for every row.

`PagedAttention` is the per-context reference path: every sequence reads all of its own KV.
Subclasses change how decode rows are attended (e.g. shared-prefix attention) and keep the rest.
A backend built with `native=True` (the engine passes `EngineConfig.cpu_kernels`) attends on the
native CPU kernels where they take its cache (on the CPU, a supported head shape, the library
built), reading the cache in place: decode rows on `kernels.paged_decode` (a bf16 cache on the
AVX512-BF16 kernels, a float32 one on the AVX2 kernels: `native`), each prefill chunk on the
causal `kernels.paged_prefill` (`native_prefill`; bf16: 2.4-3.7x torch's SDPA at 128-2,048 tokens
on an AVX512-BF16 CPU; float32: 1.2-1.9x at 256-2,048 on AVX2); those choices are made once, at
construction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from parrot.engine import kernels
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
    # [1, 1, T, S] bool, bottom-right causal; None when S == T (plain causal) or the native kernel runs
    mask: torch.Tensor | None


class PagedAttention:
    name = "paged"

    def __init__(self, cache: KVCache, num_heads: int, num_kv_heads: int, head_dim: int, native: bool = False) -> None:
        self.cache = cache
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.num_groups = num_heads // num_kv_heads
        self.scale = head_dim**-0.5
        self.slot_mapping = torch.empty(0, dtype=torch.long)
        self.num_decode = 0
        self.prefills: list[PrefillMeta] = []
        self.rows: kernels.NativeRows | kernels.Float32DecodeRows | None = None  # the step as data (native_rows)
        # Decode rows run on kernels.paged_decode, prefill chunks on kernels.paged_prefill (fixed for
        # the backend's life).
        self.native = native and kernels.paged_decode_on(cache.k, num_heads, num_kv_heads, head_dim)
        self.native_prefill = native and kernels.paged_prefill_on(cache.k, num_heads, num_kv_heads, head_dim)
        self.decode_pieces: kernels.CascadePieces | None = None  # float32 native decode's step rows

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
        for s in seqs[num_decode:]:
            num_blocks = -(-s.seq_len // bs)
            past = s.seq_len - s.num_new
            mask = None
            if past and not self.native_prefill:
                # A [1, 1, T, S] mask broadcast over heads keeps SDPA on its fast (flash) path.
                mask = (torch.arange(s.seq_len)[None, :] <= torch.arange(s.num_new)[:, None] + past)[None, None]
            ids = torch.tensor(s.block_table[:num_blocks], dtype=torch.long)
            self.prefills.append(PrefillMeta(row, s.num_new, s.seq_len, ids, mask))
            row += s.num_new
        self.rows = None
        per_context = type(self).forward is PagedAttention.forward and type(self).decode is PagedAttention.decode
        decode_only = num_decode == len(seqs) and num_decode > 0
        k, v = self.cache.k, self.cache.v
        if self.native_prefill and kernels.prefill_matches_decode(k) and per_context and decode_only:
            self.rows = kernels.NativeRows(k, v, slot_mapping, self.decode_tables, self.decode_lens, self.scale)
        elif decode_only and type(self).forward is PagedAttention.forward and k.dtype == torch.float32:
            pieces = self.native_decode_pieces()
            if pieces is not None:
                self.rows = kernels.Float32DecodeRows(k, v, slot_mapping, pieces, self.scale)

    def native_rows(self) -> kernels.NativeRows | kernels.Float32DecodeRows | None:
        """This step as data when `forward` would write the rows' K/V to their slots and attend
        every row on a native kernel (then a fused layer may run both itself, bit for bit), else
        None: `kernels.NativeRows` for a bf16 cache's per-context decode (`kernels.paged_decode`),
        `kernels.Float32DecodeRows` for a float32 cache's decode on its cascade kernel."""
        return self.rows

    def native_decode_pieces(self) -> kernels.CascadePieces | None:
        """The pieces `decode` attends this step's decode rows over on the float32 cascade kernel
        (`kernels.cascade_decode`), or None where it takes another path."""
        return self.decode_pieces

    def prepare_decode(self, seqs: list[SeqSpec]) -> None:
        self.decode_pieces = None
        if not seqs:
            return
        bs = self.cache.block_size
        max_blocks = max(-(-s.seq_len // bs) for s in seqs)
        tables = torch.tensor(padded_tables(seqs, max_blocks, bs), dtype=torch.long)
        lens = torch.tensor([s.seq_len for s in seqs])
        self.decode_tables = tables  # [B, max_blocks]
        self.decode_lens = lens
        if self.native:  # the native kernel reads the cache in place: no masks, no gather buffers
            if self.cache.k.dtype == torch.float32:  # its rows as pieces, once for every layer
                self.decode_pieces = kernels.CascadePieces.per_context(tables, lens)
            return
        # [B, 1, 1, max_blocks * bs]: True where the slot holds this sequence's KV.
        self.decode_mask = (torch.arange(max_blocks * bs)[None, :] < lens[:, None])[:, None, None, :]
        # An additive mask keeps SDPA on its fused path; gather buffers are reused by every layer.
        dtype = self.cache.k.dtype
        self.decode_bias = torch.zeros(self.decode_mask.shape, dtype=dtype).masked_fill_(
            ~self.decode_mask, float("-inf")
        )
        self.decode_ids = tables.reshape(-1)
        shape = (self.decode_ids.numel(), bs, self.num_kv_heads, self.head_dim)
        self.k_buf = torch.empty(shape, dtype=dtype)
        self.v_buf = torch.empty(shape, dtype=dtype)

    # ---- per layer ------------------------------------------------------------------------
    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [N, Hq, D], k/v [N, Hkv, D] -> [N, Hq * D]."""
        self.cache.write(layer, self.slot_mapping, k, v)
        n = q.shape[0]
        out = torch.empty(n, self.num_heads * self.head_dim, dtype=q.dtype, device=q.device)
        if self.num_decode:
            out[: self.num_decode] = self.decode(layer, q[: self.num_decode])
        for p in self.prefills:
            rows = slice(p.row_start, p.row_start + p.num_new)
            out[rows] = self.prefill(layer, p, q[rows], k[rows], v[rows])
        return out

    def decode(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """q [B, Hq, D] -> [B, Hq * D]; each row attends to its whole own KV."""
        if self.decode_pieces is not None:
            return kernels.cascade_decode(q, self.cache.k[layer], self.cache.v[layer], self.decode_pieces, self.scale)
        if self.native:
            return kernels.paged_decode(
                q, self.cache.k[layer], self.cache.v[layer], self.decode_tables, self.decode_lens, self.scale
            )
        b, hkv, d = q.shape[0], self.num_kv_heads, self.head_dim
        # Gather each sequence's blocks into the step's buffers: [B, nb*bs, Hkv, D].
        keys = torch.index_select(self.cache.k[layer], 0, self.decode_ids, out=self.k_buf).view(b, -1, hkv, d)
        vals = torch.index_select(self.cache.v[layer], 0, self.decode_ids, out=self.v_buf).view(b, -1, hkv, d)
        # The G query heads of one KV head attend as G query rows: no KV repeat.
        qg = q.view(b, hkv, self.num_groups, d)
        o = F.scaled_dot_product_attention(
            qg, keys.transpose(1, 2), vals.transpose(1, 2), attn_mask=self.decode_bias, scale=self.scale
        )
        return o.reshape(b, -1)

    def prefill(self, layer: int, p: PrefillMeta, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """One chunk of T new tokens after S-T cached ones: q [T, Hq, D] -> [T, Hq * D]."""
        if self.native_prefill:  # reads the chunk's K/V, written by `forward`, from the cache
            k_cache, v_cache = self.cache.k[layer], self.cache.v[layer]
            return kernels.paged_prefill(q, k_cache, v_cache, p.block_ids, p.seq_len, self.scale)
        if p.mask is None:
            keys, vals = k, v  # nothing cached before this chunk: attend to the new tokens only
        else:
            keys = gather_blocks(self.cache.k[layer], p.block_ids)[: p.seq_len]
            vals = gather_blocks(self.cache.v[layer], p.block_ids)[: p.seq_len]
        # [1, H, T|S, D]; enable_gqa lets SDPA share each KV head across its G query heads.
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None],
            keys.transpose(0, 1)[None],
            vals.transpose(0, 1)[None],
            attn_mask=p.mask,
            is_causal=p.mask is None,
            scale=self.scale,
            enable_gqa=True,
        )
        return o[0].transpose(0, 1).reshape(p.num_new, -1)


def gather_blocks(layer_cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """layer_cache [NB, bs, H, D], block_ids [..., n] -> [..., n * bs, H, D] (one index_select).

    index_select over whole blocks is ~10x faster than advanced indexing of the 4-d cache.
    """
    nb, bs, h, d = layer_cache.shape
    rows = layer_cache.view(nb, bs * h * d).index_select(0, block_ids.reshape(-1))
    return rows.view(*block_ids.shape[:-1], block_ids.shape[-1] * bs, h, d)


def padded_tables(seqs: list[SeqSpec], width: int, block_size: int) -> list[list[int]]:
    """Each sequence's blocks up to its length, zero-padded to `width` (plain lists: one tensor
    copy for the whole step)."""
    out = []
    for s in seqs:
        n = -(-s.seq_len // block_size)
        out.append(s.block_table[:n] + [0] * (width - n))
    return out


def _is_decode(s: SeqSpec) -> bool:
    """A one-token step of a sequence with KV before it (a 1-token prompt is a prefill)."""
    return s.seq_len > 1
