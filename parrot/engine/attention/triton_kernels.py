"""Triton kernels for shared-prefix ("cascade") decode attention over the paged KV cache.

Same contract as the CPU path in `shared_prefix.py`, from the same `SharedPrefixPlan`:
  1. prefix pass: for each segment (split into chunks of its prefix tokens), one program per
     (BLOCK_M query rows, KV head) attends the segment's stacked query rows -- the G query heads
     of the KV head times the segment's decode rows -- to the chunk, reading each KV tile once
     for all of them; it writes the normalised partial output and its max/sum statistics;
  2. suffix pass: the same kernel over each row's private tail (paged decode: G query rows);
  3. merge: per (decode row, KV head), combine that row's partials exactly (online log-sum-exp).

Shapes: q [B, Hq, D]; k/v cache of one layer [num_blocks, block_size, Hkv, D]; partials are
"entries" (one decode row's result over one chunk): o [E, Hkv, G, D] fp32, and m, l [E, Hkv, G]
fp32 with m the running max of the log2-scaled scores and l the sum of exp2(score - m).
Work items are int32 rows [row_off, num_rows, m_start, block_off, tok_start, tok_end, entry_base].

Runs on CUDA tensors, or on CPU tensors under `TRITON_INTERPRET=1`, which must be set before
triton is first imported (triton's own library functions are decorated then); there, bf16
`tl.dot` is broken, so operands are upcast to fp32. This module imports without triton;
`unavailable_reason` says why it cannot run. The backends import it only when one is built.
"""

import os
from dataclasses import dataclass

import numpy as np
import torch

from parrot.engine.attention.shared_prefix import SharedPrefixPlan

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the "shared_prefix" backend needs no triton
    triton = None

_NUM_WORK_FIELDS = 7
LOG2E = 1.4426950408889634


# Whether the kernels below were decorated as interpreted (CPU tensors) or compiled (CUDA).
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def unavailable_reason(device: torch.device) -> str | None:
    """None when the kernels can run on tensors on `device`, else why not."""
    if triton is None:
        return "triton is not installed (pip install triton==3.9.0)"
    if INTERPRETED:
        if _library_compiled():
            return "triton was imported before TRITON_INTERPRET=1 was set (its library is in compiled mode)"
        if device.type == "cpu":
            return None
        return f"TRITON_INTERPRET=1 runs kernels on CPU tensors only, and the KV cache is on {device}"
    if device.type == "cuda":
        return None
    return (
        f"the KV cache is on {device}; Triton needs a CUDA device "
        "(or TRITON_INTERPRET=1, set before triton is imported, for CPU tests)"
    )


def _library_compiled() -> bool:
    """Whether triton's own jit functions were decorated for compiled mode (at triton's import)."""
    fn = getattr(getattr(tl, "standard", None), "sigmoid", None)
    return fn is not None and type(fn).__name__ == "JITFunction"


if triton is not None:

    @triton.jit
    def _partial_attention_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        o_ptr,
        m_ptr,
        l_ptr,
        work_ptr,
        rows_ptr,
        blocks_ptr,
        stride_qb,
        stride_qh,
        stride_kb,
        stride_ks,
        stride_kh,
        qk_scale,
        block_size,
        G: tl.constexpr,
        D: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        UPCAST: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
    ):
        work = work_ptr + tl.program_id(0) * 7
        kvh = tl.program_id(1)
        row_off, num_q = tl.load(work), tl.load(work + 1) * G
        m_start, block_off = tl.load(work + 2), tl.load(work + 3)
        tok_start, tok_end, entry = tl.load(work + 4), tl.load(work + 5), tl.load(work + 6)
        offs_m = m_start + tl.arange(0, BLOCK_M)  # stacked query rows, ordered (row, g)
        valid_m = offs_m < num_q
        local, g = offs_m // G, offs_m % G
        row = tl.load(rows_ptr + row_off + local, mask=valid_m, other=0).to(tl.int64)
        offs_d = tl.arange(0, BLOCK_D)
        valid_d = offs_d < D
        q_off = row[:, None] * stride_qb + (kvh * G + g)[:, None] * stride_qh + offs_d[None, :]
        q = tl.load(q_ptr + q_off, mask=valid_m[:, None] & valid_d[None, :], other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for start in range(tok_start, tok_end, BLOCK_N):
            t = start + tl.arange(0, BLOCK_N)
            valid_n = t < tok_end
            block = tl.load(blocks_ptr + block_off + t // block_size, mask=valid_n, other=0).to(tl.int64)
            kv_off = block * stride_kb + (t % block_size) * stride_ks + kvh * stride_kh
            kv_mask = valid_n[:, None] & valid_d[None, :]
            k = tl.load(k_ptr + kv_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
            v = tl.load(v_ptr + kv_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
            if UPCAST:
                k, v = k.to(tl.float32), v.to(tl.float32)
            s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
            s = tl.where(valid_n[None, :], s * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp2(s - m_new[:, None])
            alpha = tl.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m_i = m_new
        # Entries are [E, Hkv, G(, D)] contiguous; the segment's local row i is entry `entry + i`.
        stat_off = ((entry + local).to(tl.int64) * tl.num_programs(1) + kvh) * G + g
        o_off = stat_off[:, None] * D + offs_d[None, :]
        tl.store(o_ptr + o_off, acc / l_i[:, None], mask=valid_m[:, None] & valid_d[None, :])
        tl.store(m_ptr + stat_off, m_i, mask=valid_m)
        tl.store(l_ptr + stat_off, l_i, mask=valid_m)

    @triton.jit
    def _merge_kernel(
        o_ptr,
        m_ptr,
        l_ptr,
        offsets_ptr,
        entries_ptr,
        out_ptr,
        stride_out,
        G: tl.constexpr,
        GP: tl.constexpr,
        D: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        num_kv = tl.num_programs(1)
        g = tl.arange(0, GP)
        valid_g = g < G
        offs_d = tl.arange(0, BLOCK_D)
        mask = valid_g[:, None] & (offs_d < D)[None, :]
        big_m = tl.full([GP], float("-inf"), tl.float32)
        big_l = tl.zeros([GP], tl.float32)
        acc = tl.zeros([GP, BLOCK_D], tl.float32)
        for j in range(tl.load(offsets_ptr + b), tl.load(offsets_ptr + b + 1)):
            stat_off = (tl.load(entries_ptr + j).to(tl.int64) * num_kv + kvh) * G + g
            # Padding lanes read m=0, l=1, o=0: finite, never stored.
            m = tl.load(m_ptr + stat_off, mask=valid_g, other=0.0)
            l_e = tl.load(l_ptr + stat_off, mask=valid_g, other=1.0)
            o = tl.load(o_ptr + stat_off[:, None] * D + offs_d[None, :], mask=mask, other=0.0)
            m_new = tl.maximum(big_m, m)
            alpha = tl.exp2(big_m - m_new)
            w = l_e * tl.exp2(m - m_new)
            acc = acc * alpha[:, None] + w[:, None] * o
            big_l = big_l * alpha + w
            big_m = m_new
        out_off = b * stride_out + (kvh * G + g)[:, None] * D + offs_d[None, :]
        tl.store(out_ptr + out_off, (acc / big_l[:, None]).to(out_ptr.dtype.element_ty), mask=mask)


@dataclass(frozen=True)
class _Pass:
    work: torch.Tensor  # [W, 7] int32
    block_m: int


@dataclass(frozen=True)
class TritonCascadeMeta:
    """One step's device metadata for the kernels, built once from a plan (host work, numpy)."""

    prefix: _Pass
    suffix: _Pass
    rows: torch.Tensor  # int32, flat: each segment's rows, then 0..B-1 for the tails
    blocks: torch.Tensor  # int32, flat: each segment's blocks, then the tail tables row by row
    entry_offsets: torch.Tensor  # [B + 1] int32: row b's entries are entry_ids[off[b]:off[b+1]]
    entry_ids: torch.Tensor  # [E] int32
    num_entries: int

    @classmethod
    def build(
        cls,
        plan: SharedPrefixPlan,
        block_size: int,
        num_groups: int,
        device: torch.device,
        prefix_split: int | None = None,
        tail_split: int | None = None,
        target_programs: int = 128,
    ) -> "TritonCascadeMeta":
        """`prefix_split`/`tail_split`: tokens per program; by default chosen so each pass has
        about `target_programs` programs per KV head (enough to fill a GPU), 256 tokens at least."""
        num_rows, tail_width = plan.tail_tables.shape
        rows = [np.asarray(s.rows, dtype=np.int64) for s in plan.segments] + [np.arange(num_rows)]
        blocks = [np.asarray(s.block_ids, dtype=np.int64) for s in plan.segments]
        blocks.append(np.maximum(plan.tail_tables, 0).reshape(-1))
        row_offs = np.cumsum([0] + [len(r) for r in rows])
        block_offs = np.cumsum([0] + [len(b) for b in blocks])
        entry_rows: list[np.ndarray] = []  # per chunk: the rows of its entries
        max_q = max((len(s.rows) * num_groups for s in plan.segments), default=1)
        prefix_m = min(64, max(16, next_pow2(max_q)))
        suffix_m = max(16, next_pow2(num_groups))
        num_entries = 0

        def add(
            work: list[list[int]],
            seg_rows: np.ndarray,
            row_off: int,
            block_off: int,
            num_tokens: int,
            split: int,
            block_m: int,
        ) -> None:
            nonlocal num_entries
            for tok in range(0, num_tokens, split):
                entry_rows.append(seg_rows)
                for m_start in range(0, len(seg_rows) * num_groups, block_m):
                    work.append(
                        [row_off, len(seg_rows), m_start, block_off, tok, min(num_tokens, tok + split), num_entries]
                    )
                num_entries += len(seg_rows)

        if prefix_split is None:
            tile_tokens = sum(-(-len(s.rows) * num_groups // prefix_m) * s.num_tokens for s in plan.segments)
            prefix_split = _split(tile_tokens, target_programs)
        if tail_split is None:
            tail_split = _split(int(plan.tail_lens.sum()), target_programs)
        prefix_work: list[list[int]] = []
        for i, s in enumerate(plan.segments):
            add(prefix_work, rows[i], int(row_offs[i]), int(block_offs[i]), s.num_tokens, prefix_split, prefix_m)
        suffix_work: list[list[int]] = []
        tail_row_off, tail_block_off = int(row_offs[-2]), int(block_offs[-2])
        for b in range(num_rows):
            add(
                suffix_work,
                rows[-1][b : b + 1],
                tail_row_off + b,
                tail_block_off + b * tail_width,
                int(plan.tail_lens[b]),
                tail_split,
                suffix_m,
            )
        entry_row = np.concatenate(entry_rows)
        order = np.argsort(entry_row, kind="stable")
        offsets = np.concatenate([[0], np.cumsum(np.bincount(entry_row, minlength=num_rows))])

        def dev(a: np.ndarray | list) -> torch.Tensor:
            return torch.as_tensor(np.asarray(a, dtype=np.int32)).to(device)

        return cls(
            _Pass(dev(prefix_work).view(-1, _NUM_WORK_FIELDS), prefix_m),
            _Pass(dev(suffix_work).view(-1, _NUM_WORK_FIELDS), suffix_m),
            dev(np.concatenate(rows)),
            dev(np.concatenate(blocks)),
            dev(offsets),
            dev(order),
            len(entry_row),
        )


def _split(total_tokens: int, target_programs: int) -> int:
    """Tokens per program: a multiple of the kernel's 64-token tile, at least 256."""
    return max(256, -(-total_tokens // max(1, target_programs) // 64) * 64)


def next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def cascade_decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: TritonCascadeMeta, scale: float
) -> torch.Tensor:
    """q [B, Hq, D], k/v_cache [num_blocks, bs, Hkv, D] (one layer) -> [B, Hq * D] in q's dtype."""
    assert triton is not None, "triton is not installed"
    b, hq, d = q.shape
    _, block_size, hkv, _ = k_cache.shape
    g = hq // hkv
    q = q.contiguous()
    o_ws = torch.empty(meta.num_entries, hkv, g, d, dtype=torch.float32, device=q.device)
    m_ws = torch.empty(meta.num_entries, hkv, g, dtype=torch.float32, device=q.device)
    l_ws = torch.empty_like(m_ws)
    # Under the interpreter bf16 dots are wrong: compute in fp32 there. fp32 operands get exact
    # dots ("ieee"); fp16/bf16 ones the tensor cores' default ("tf32" only matters for fp32).
    upcast = INTERPRETED
    precision = "ieee" if upcast or q.dtype == torch.float32 else "tf32"
    block_d = next_pow2(d)
    for p in (meta.prefix, meta.suffix):
        if p.work.shape[0] == 0:
            continue
        _partial_attention_kernel[(p.work.shape[0], hkv)](
            q,
            k_cache,
            v_cache,
            o_ws,
            m_ws,
            l_ws,
            p.work,
            meta.rows,
            meta.blocks,
            q.stride(0),
            q.stride(1),
            k_cache.stride(0),
            k_cache.stride(1),
            k_cache.stride(2),
            scale * LOG2E,
            block_size,
            G=g,
            D=d,
            BLOCK_D=block_d,
            BLOCK_M=p.block_m,
            BLOCK_N=64,
            UPCAST=upcast,
            DOT_PRECISION=precision,
        )
    out = torch.empty(b, hq * d, dtype=q.dtype, device=q.device)
    _merge_kernel[(b, hkv)](
        o_ws,
        m_ws,
        l_ws,
        meta.entry_offsets,
        meta.entry_ids,
        out,
        out.stride(0),
        G=g,
        GP=next_pow2(g),
        D=d,
        BLOCK_D=block_d,
    )
    return out
