"""Native attention over the paged KV cache: decode (one query token per sequence) and prefill.

`paged_decode` attends each sequence to its own KV, read in place through its block table;
`cascade_decode` reads each shared prefix once for all the rows that share it (`CascadePieces`:
the step's prefixes and tails), then each row's tail, and merges them by log-sum-exp;
`paged_prefill` is the causal attention of one prefill chunk over its sequence (flash-style; a
row's result depends only on its sequence, not on how the prompt was chunked or on the step's
other sequences). A bf16 cache runs the C kernels of cpu_kernels.c (`parrot_paged_decode`,
`parrot_cascade_decode`, `parrot_paged_prefill`; AVX512-BF16, and where the CPU has AMX the paged
decode and prefill on AMX tiles: `attention_amx`); a float32 cache runs block_kernels.c's
(AVX2 + FMA): `parrot_cascade_decode_f32` (per-context decode is its case of one piece per row) and
`parrot_paged_prefill_f32` (another summation order than its decode: a prompt row and a decode
row over the same keys agree to rounding, not bit for bit). An attention backend decides once,
when it is built, whether it decodes natively (`paged_decode_on`) and prefills natively
(`paged_prefill_on`), given the engine's setting.
"""

from __future__ import annotations

import ctypes
import itertools
from dataclasses import dataclass

import torch

from parrot.engine.kernels.library import available, blocks_library, load


def paged_decode_on(cache_k: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
    """Whether decode over a cache like `cache_k` can run on `paged_decode` / `cascade_decode`
    here: a CPU cache of a supported dtype and shape, and its library built (on first call)."""
    if cache_k.device.type != "cpu" or not paged_decode_supported(cache_k.dtype, num_heads, num_kv_heads, head_dim):
        return False
    return available() if cache_k.dtype == torch.bfloat16 else blocks_library() is not None


def paged_prefill_on(cache_k: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
    """Whether a prefill chunk over a cache like `cache_k` can run on `paged_prefill` (float32 also
    needs D % 16 == 0)."""
    if cache_k.dtype == torch.float32 and head_dim % 16:
        return False
    return paged_decode_on(cache_k, num_heads, num_kv_heads, head_dim)


def attention_amx(on: bool | None = None) -> bool:
    """Whether the bf16 paged decode and prefill kernels attend on AMX (the default where the CPU
    has it and the OS granted its tile state; else AVX512-BF16); `on` switches the process to one
    or the other first (where AMX runs). Both paths give a row the same bits in decode and in
    prefill, but not the same bits as each other: an engine must not switch between its steps
    (benchmarks.engine.kernels --amx-attention-ab switches between timed steps of one engine)."""
    lib = load()
    if lib is None:
        return False
    return bool(lib.parrot_attention_amx(-1 if on is None else int(on)))


def prefill_matches_decode(cache_k: torch.Tensor) -> bool:
    """Whether `paged_prefill` gives a prompt row the bits `paged_decode` gives the same query over
    the same keys: bf16's two kernels share one per-row arithmetic; float32's sum in other orders."""
    return cache_k.dtype == torch.bfloat16


def paged_decode_supported(dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
    """Whether the decode kernels take this attention shape: bf16 with D % 32 == 0, D <= 256,
    G <= 16; float32 with D % 8 == 0, D <= 256."""
    if num_heads % num_kv_heads or head_dim > 256:
        return False
    if dtype == torch.bfloat16:
        return head_dim % 32 == 0 and num_heads // num_kv_heads <= 16
    return dtype == torch.float32 and head_dim % 8 == 0


def _checked_decode_lib(
    name: str, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, *more: torch.Tensor
) -> ctypes.CDLL:
    """The library for q's dtype, after the checks the decode kernels need (layout, dtype, device)."""
    if q.stride(2) != 1 or q.stride(1) != q.shape[2] or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError(f"{name}: q heads and the cache must be contiguous")
    if not q.dtype == k_cache.dtype == v_cache.dtype or q.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"{name}: q and the cache must be all bfloat16 or all float32")
    if any(t.device.type != "cpu" for t in (q, k_cache, v_cache, *more)):
        raise ValueError(f"{name}: CPU tensors only")
    lib = load() if q.dtype == torch.bfloat16 else blocks_library()
    assert lib is not None, f"{name} without the native kernels for {q.dtype}"
    return lib


def _decode_shape(out: torch.Tensor, q: torch.Tensor, k_cache: torch.Tensor, scale: float) -> tuple:
    """The trailing arguments both decode kernels take: out, B, Hq, Hkv, D, block size, scale, threads."""
    b, hq, d = q.shape
    _, bs, hkv, _ = k_cache.shape
    return (out.data_ptr(), b, hq, hkv, d, bs, scale, torch.get_num_threads())


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per sequence over its paged KV, read in place: q [B, Hq, D] (rows may be
    strided), k/v_cache [blocks, bs, Hkv, D], block_tables [B, max_blocks] int64, seq_lens [B]
    int64 -> [B, Hq * D]. Callers check `paged_decode_on` first. A float32 cache runs as the
    cascade of one piece per row (`CascadePieces.per_context`; a backend builds those once a step)."""
    lib = _checked_decode_lib("paged_decode", q, k_cache, v_cache, block_tables, seq_lens)
    tables, lens = block_tables.contiguous().long(), seq_lens.contiguous().long()
    if lens.numel() and int(lens.min()) < 1:
        raise ValueError("paged_decode: every sequence needs at least one token of KV")
    if q.dtype == torch.float32:
        return cascade_decode(q, k_cache, v_cache, CascadePieces.per_context(tables, lens), scale)
    out = torch.empty(q.shape[0], q.shape[1] * q.shape[2], dtype=torch.bfloat16)
    head = (q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr())
    args = (tables.data_ptr(), tables.shape[1], lens.data_ptr())
    failed = lib.parrot_paged_decode(*head, *args, *_decode_shape(out, q, k_cache, scale))
    if failed:
        raise MemoryError(f"paged_decode: {failed} work items could not allocate their scores")
    return out


@dataclass(frozen=True)
class CascadePieces:
    """A step's decode rows as pieces of KV for `cascade_decode`: each shared prefix once for the
    rows sharing it, then each row's private tail (int64 CSR arrays; see parrot_cascade_decode)."""

    block_ptr: torch.Tensor  # [P + 1]: piece p reads blocks[block_ptr[p]:block_ptr[p + 1]]
    blocks: torch.Tensor
    lens: torch.Tensor  # [P]: tokens of each piece (>= 1)
    row_ptr: torch.Tensor  # [P + 1]: piece p serves rows[row_ptr[p]:row_ptr[p + 1]]
    rows: torch.Tensor
    slot_ptr: torch.Tensor  # [B + 1]: row b's partials are slots[slot_ptr[b]:slot_ptr[b + 1]]
    slots: torch.Tensor

    @classmethod
    def build(cls, pieces: list[tuple[list[int], list[int], int]], num_rows: int) -> CascadePieces:
        """pieces: (rows, block ids, num tokens) each; every row must be in at least one piece."""

        def csr(lists: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
            ptr = torch.tensor([0, *itertools.accumulate(len(x) for x in lists)], dtype=torch.long)
            return ptr, torch.tensor([v for x in lists for v in x], dtype=torch.long)

        block_ptr, blocks = csr([b for _, b, _ in pieces])
        row_ptr, rows = csr([r for r, _, _ in pieces])
        per_row: list[list[int]] = [[] for _ in range(num_rows)]
        for slot, r in enumerate(rows.tolist()):
            per_row[r].append(slot)
        if any(not s for s in per_row):
            raise ValueError("cascade_decode: every row needs a piece")
        lens = torch.tensor([n for _, _, n in pieces], dtype=torch.long)
        if lens.numel() and int(lens.min()) < 1:
            raise ValueError("cascade_decode: every piece needs at least one token")
        slot_ptr, slots = csr(per_row)
        return cls(block_ptr, blocks, lens, row_ptr, rows, slot_ptr, slots)

    def arrays(self) -> tuple[torch.Tensor, ...]:
        """The int64 arrays in the order the cascade kernels take them."""
        return (self.block_ptr, self.blocks, self.lens, self.row_ptr, self.rows, self.slot_ptr, self.slots)

    @classmethod
    def per_context(cls, block_tables: torch.Tensor, seq_lens: torch.Tensor) -> CascadePieces:
        """Each row's whole KV as its one piece: block_tables [B, max_blocks], seq_lens [B] (int64)."""
        b, width = block_tables.shape
        ids = torch.arange(b + 1, dtype=torch.long)
        return cls(ids * width, block_tables.reshape(-1), seq_lens, ids, ids[:b], ids, ids[:b])


def cascade_decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pieces: CascadePieces, scale: float
) -> torch.Tensor:
    """`paged_decode` with each shared prefix read once for its rows: q [B, Hq, D] (rows may be
    strided), k/v_cache [blocks, bs, Hkv, D] -> [B, Hq * D]. Same checks as `paged_decode`."""
    lib = _checked_decode_lib("cascade_decode", q, k_cache, v_cache)
    if pieces.slot_ptr.numel() != q.shape[0] + 1:
        raise ValueError(f"cascade_decode: pieces are for {pieces.slot_ptr.numel() - 1} rows, q has {q.shape[0]}")
    out = torch.empty(q.shape[0], q.shape[1] * q.shape[2], dtype=q.dtype)
    p = pieces
    head = (q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr())
    args = (p.lens.numel(), *(t.data_ptr() for t in p.arrays()))
    kernel = lib.parrot_cascade_decode if q.dtype == torch.bfloat16 else lib.parrot_cascade_decode_f32
    failed = kernel(*head, *args, *_decode_shape(out, q, k_cache, scale))
    if failed:
        raise MemoryError(f"cascade_decode: {failed} work items could not allocate their buffers")
    return out


def paged_prefill(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_ids: torch.Tensor, seq_len: int, scale: float
) -> torch.Tensor:
    """Causal attention of one prefill chunk over its sequence's paged KV, read in place: q [T, Hq, D]
    (rows may be strided) are the queries of positions seq_len - T .. seq_len - 1, whose K/V are
    already in the cache; k/v_cache [blocks, bs, Hkv, D]; block_ids: the sequence's blocks (int64,
    at least ceil(seq_len / bs)) -> [T, Hq * D]. Callers check `paged_decode_on` first."""
    lib = _checked_decode_lib("paged_prefill", q, k_cache, v_cache, block_ids)
    t, hq, d = q.shape
    _, bs, hkv, _ = k_cache.shape
    ids = block_ids.contiguous().long()
    if not 1 <= t <= seq_len or ids.numel() * bs < seq_len:
        raise ValueError(f"paged_prefill: {t} queries, {seq_len} tokens, {ids.numel()} blocks of {bs}")
    if not paged_prefill_on(k_cache, hq, hkv, d):
        raise ValueError(f"paged_prefill: no kernel for {hq} / {hkv} heads of {d} in {q.dtype}")
    out = torch.empty(t, hq * d, dtype=q.dtype)
    padded = -(-seq_len // 64) * 64  # the kernels' key tiles (64 keys; float32: 32)
    kpack = torch.empty(hkv * padded * d, dtype=q.dtype)
    vpack = torch.empty_like(kpack)
    head = (q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), ids.data_ptr(), t, seq_len)
    bufs = (out.data_ptr(), kpack.data_ptr(), vpack.data_ptr())
    kernel = lib.parrot_paged_prefill if q.dtype == torch.bfloat16 else lib.parrot_paged_prefill_f32
    failed = kernel(*head, *bufs, hq, hkv, d, bs, scale, torch.get_num_threads())
    if failed:
        raise MemoryError(f"paged_prefill: {failed} work items could not allocate their buffers")
    return out
