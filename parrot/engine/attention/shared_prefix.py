"""Shared-prefix ("cascade") decode attention: the step's prefix groups, and the CPU kernel.

Contexts forked from one parent list the parent's full KV blocks by the same physical ids, so the
decode rows of a step that share a prefix are found from their block tables alone, once per step:
`plan_shared_prefixes` builds a trie over block ids and returns `Segment`s (rows that share exactly
those blocks; nested, e.g. a system prompt shared by all rows and a document shared by some) and
each row's private tail (the blocks no segment covers, the newest token's block last).

`cascade_decode` then attends each segment once for all its rows (the G query heads of each KV
head times the segment's rows are the query rows of one attention over the un-repeated prefix KV),
each row's tail per row (gathered, padded, masked, as `PagedAttention.decode`), and folds the
segments' partial outputs into the tails' exactly with their log-sum-exp in float32. Attention is a
sum over key slots, so splitting a row's slots into disjoint sets and merging is exact up to
rounding.

Ownership: plans and `CascadeMeta` are built by the attention backend in `prepare` and are valid
for that one step only (block tables change between steps).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class GroupingConfig:
    """When a shared run of blocks becomes a segment (below it, the tokens stay per row)."""

    min_group_size: int = 2  # rows that must share the blocks
    min_shared_tokens: int = 256  # tokens the shared blocks must hold
    min_saved_tokens: int = 0  # token reads the segment spares: (rows - 1) x its tokens

    def __post_init__(self) -> None:
        if self.min_group_size < 2:
            raise ValueError(f"min_group_size must be >= 2, got {self.min_group_size}")
        if self.min_shared_tokens < 1:
            raise ValueError(f"min_shared_tokens must be >= 1, got {self.min_shared_tokens}")
        if self.min_saved_tokens < 0:
            raise ValueError(f"min_saved_tokens must be >= 0, got {self.min_saved_tokens}")


@dataclass(frozen=True)
class Segment:
    """Decode rows `rows` (ascending) all attend to the `num_tokens` slots of `block_ids`."""

    rows: tuple[int, ...]
    block_ids: tuple[int, ...]
    num_tokens: int


@dataclass(frozen=True, eq=False)
class SharedPrefixPlan:
    segments: tuple[Segment, ...]  # parents before children (trie preorder)
    tail_tables: np.ndarray  # [B, max_tail_blocks] int64: each row's unshared blocks, -1 padded
    tail_lens: np.ndarray  # [B] int64: slots each row reads from its tail (always >= 1)

    def tail(self, row: int) -> tuple[list[int], int]:
        """(block ids, num slots) of one row's tail."""
        ids = self.tail_tables[row]
        return ids[ids >= 0].tolist(), int(self.tail_lens[row])


def plan_shared_prefixes(
    block_tables: Sequence[Sequence[int]],
    seq_lens: Sequence[int],
    block_size: int,
    config: GroupingConfig | None = None,
) -> SharedPrefixPlan:
    """Group decode rows by the leading block ids they share (a trie, walked once per step).

    Row i attends to slots [0, seq_lens[i]) through block_tables[i]. Only blocks wholly before a
    row's newest token can be shared: that token's block is written this step, so it is private
    (copy-on-write) and every tail keeps at least one slot. A trie node whose rows number at least
    `min_group_size` becomes a segment once the blocks not yet assigned on its path (its own, plus
    those of ancestors too short to pay) hold at least `min_shared_tokens`, and reading them once
    spares at least `min_saved_tokens` token reads ((rows - 1) x tokens); otherwise they are
    carried down to its children, and to the rows' tails where the path ends.
    """
    cfg = config or GroupingConfig()
    bs = block_size
    lens = np.asarray(seq_lens, dtype=np.int64)
    num_rows = len(lens)
    num_blocks = -(-lens // bs)
    num_full = (lens - 1) // bs
    width = int(num_blocks.max(initial=0))
    tables = np.zeros((num_rows, width), dtype=np.int64)
    for i, table in enumerate(block_tables):
        tables[i, : num_blocks[i]] = table[: num_blocks[i]]
    cols = np.arange(width)
    keys = np.where(cols < num_full[:, None], tables, -1)  # -1: not shareable
    shared = np.zeros((num_rows, width), dtype=bool)
    segments: list[Segment] = []
    # (rows, column where their common run starts, first column not yet given to a segment)
    stack = [(np.arange(num_rows), 0, 0)]
    while stack:
        rows, start, pending = stack.pop()
        if len(rows) < cfg.min_group_size:
            continue  # fewer rows only below: the pending blocks stay in the tails
        sub = keys[rows, start:]
        same = (sub == sub[0]).all(axis=0) & (sub[0] >= 0)
        end = start + (int(same.argmin()) if not same.all() else len(same))
        num_tokens = (end - pending) * bs
        if (
            end > pending
            and num_tokens >= cfg.min_shared_tokens
            and (len(rows) - 1) * num_tokens >= cfg.min_saved_tokens
        ):
            segments.append(Segment(tuple(rows.tolist()), tuple(keys[rows[0], pending:end].tolist()), num_tokens))
            shared[rows, pending:end] = True
            pending = end
        if end < width:
            nxt = keys[rows, end]
            for block in np.unique(nxt[nxt >= 0])[::-1]:  # reversed: children pop in ascending order
                stack.append((rows[nxt == block], end, pending))
    # Tails: the unshared blocks in table order (stable sort), so only the last one is partial.
    excluded = shared | (cols >= num_blocks[:, None])
    order = np.argsort(excluded, axis=1, kind="stable")
    num_tail = width - excluded.sum(axis=1)
    tail_width = int(num_tail.max(initial=0))
    tail_tables = np.take_along_axis(tables, order, axis=1)[:, :tail_width]
    tail_tables[np.arange(tail_width) >= num_tail[:, None]] = -1
    tail_lens = lens - shared.sum(axis=1) * bs
    return SharedPrefixPlan(tuple(segments), tail_tables, tail_lens)


# ---- the CPU kernel ---------------------------------------------------------------------------------


# The CPU flash kernel pays for masked padding, so tails are padded per bucket of similar lengths:
# a new bucket starts below this fraction of the current one's longest tail (at most MAX_BUCKETS).
BUCKET_RATIO = 0.75
MAX_BUCKETS = 6


@dataclass(frozen=True)
class TailBucket:
    """Rows whose tails are attended together, padded to the bucket's longest."""

    rows: torch.Tensor | None  # [n] long positions in trie order; None: all rows, in order
    block_ids: torch.Tensor  # [n * nt] long: each row's tail blocks, padded with block 0
    mask: torch.Tensor  # [n, 1, 1, nt * bs] additive: 0 where the slot is the row's, -inf elsewhere
    k_buf: torch.Tensor  # [n * nt, bs, Hkv, D]: gather workspaces, reused by every layer of the step
    v_buf: torch.Tensor


@dataclass(frozen=True)
class CascadeMeta:
    """One step's tensors for `cascade_decode`, built once from a plan.

    Rows are processed in trie order (`perm`): segments are nested or disjoint, so in that order
    each segment's rows are one contiguous range, and every per-segment step works on views.
    """

    perm: torch.Tensor | None  # [B] long: processing position j holds decode row perm[j]; None: identity
    seg_ranges: list[tuple[int, int]]  # per segment: its rows as positions [lo, hi) in trie order
    seg_blocks: list[slice | torch.Tensor]  # per segment: its blocks (a slice when ids are consecutive)
    tails: list[TailBucket]

    @classmethod
    def build(
        cls, plan: SharedPrefixPlan, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> CascadeMeta:
        num_rows = len(plan.tail_lens)
        chains: list[list[int]] = [[] for _ in range(num_rows)]  # the segments holding each row, outermost first
        for i, seg in enumerate(plan.segments):
            for r in seg.rows:
                chains[r].append(i)
        order = sorted(range(num_rows), key=chains.__getitem__)  # a depth-first order of the trie
        pos = np.empty(num_rows, dtype=np.int64)
        pos[order] = np.arange(num_rows)
        seg_ranges = []
        for seg in plan.segments:
            lo = int(pos[list(seg.rows)].min())
            assert int(pos[list(seg.rows)].max()) == lo + len(seg.rows) - 1, "segments must nest"
            seg_ranges.append((lo, lo + len(seg.rows)))
        tables, lens = np.maximum(plan.tail_tables[order], 0), plan.tail_lens[order]
        tails = []
        for rows in _buckets(-(-lens // block_size)):
            nt = int(-(-lens[rows].max() // block_size))
            valid = torch.arange(nt * block_size)[None, :] < torch.from_numpy(lens[rows])[:, None]
            buf_shape = (len(rows) * nt, block_size, num_kv_heads, head_dim)
            tails.append(
                TailBucket(
                    None if len(rows) == num_rows else torch.from_numpy(rows),
                    torch.from_numpy(np.ascontiguousarray(tables[rows, :nt]).reshape(-1)),
                    torch.zeros(valid.shape, dtype=dtype).masked_fill_(~valid, float("-inf"))[:, None, None, :],
                    torch.empty(buf_shape, dtype=dtype),
                    torch.empty(buf_shape, dtype=dtype),
                )
            )
        identity = order == list(range(num_rows))
        perm = None if identity else torch.tensor(order, dtype=torch.long)
        return cls(perm, seg_ranges, [_as_index(s.block_ids) for s in plan.segments], tails)


def _buckets(num_blocks: np.ndarray) -> list[np.ndarray]:
    """Positions grouped by tail length, longest first; each group ascending."""
    by_len = np.argsort(-num_blocks, kind="stable")
    groups: list[list[int]] = []
    for p in by_len.tolist():
        if not groups or (len(groups) < MAX_BUCKETS and num_blocks[p] < BUCKET_RATIO * num_blocks[groups[-1][0]]):
            groups.append([])
        groups[-1].append(p)
    return [np.sort(np.asarray(g, dtype=np.int64)) for g in groups]


def _as_index(block_ids: tuple[int, ...]) -> slice | torch.Tensor:
    """Consecutive ids (a fresh fill's usual layout) index the cache as a view: no gather copy."""
    first, n = block_ids[0], len(block_ids)
    if block_ids[-1] == first + n - 1 and all(b == first + i for i, b in enumerate(block_ids)):
        return slice(first, first + n)
    return torch.tensor(block_ids, dtype=torch.long)


def _blocks(cache: torch.Tensor, index: slice | torch.Tensor) -> torch.Tensor:
    # index_select copies whole blocks (memcpy rows): several times faster than advanced indexing.
    return cache[index] if isinstance(index, slice) else cache.index_select(0, index)


_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def attend_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [n, H, M, D], k/v [n, H, L, D], additive mask [n, 1, 1, L] or None ->
    (out [n, H, M, D] in q's dtype, natural-log log-sum-exp of the scaled scores [n, H, M] fp32).

    On the CPU this is the fused flash kernel SDPA itself uses (fp32 accumulation, AMX for bf16),
    which also returns the log-sum-exp; elsewhere, plain fp32 math.
    """
    if q.device.type == "cpu" and _FLASH_CPU is not None:
        out, lse = _FLASH_CPU(q, k, v, attn_mask=mask, scale=scale)
        return out, lse
    return attend_with_lse_math(q, k, v, mask, scale)


def attend_with_lse_math(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """`attend_with_lse` in plain fp32 torch ops (any device; materialises the scores)."""
    scores = (q.float() @ k.float().transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores + mask.float()
    lse = torch.logsumexp(scores, dim=-1)
    return (torch.exp(scores - lse[..., None]) @ v.float()).to(q.dtype), lse


def merge_into(acc: torch.Tensor, acc_lse: torch.Tensor, out: torch.Tensor, lse: torch.Tensor) -> None:
    """Fold a partial attention over other keys into an fp32 accumulator, exactly, in place.

    acc [n, Hkv, G, D] fp32 and acc_lse [n, Hkv, G] fp32 (views are fine), out/lse alike:
    acc = (acc e^acc_lse + out e^lse) / (e^acc_lse + e^lse), acc_lse = log(e^acc_lse + e^lse).
    """
    new_lse = torch.logaddexp(acc_lse, lse)
    acc.mul_(torch.exp(acc_lse - new_lse).unsqueeze(-1)).add_(out * torch.exp(lse - new_lse).unsqueeze(-1))
    acc_lse.copy_(new_lse)


def cascade_decode(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: CascadeMeta, scale: float
) -> torch.Tensor:
    """q [B, Hq, D], k/v_cache [num_blocks, bs, Hkv, D] (one layer) -> [B, Hq * D] in q's dtype."""
    b, hq, d = q.shape
    hkv = k_cache.shape[2]
    g = hq // hkv
    qg = q.view(b, hkv, g, d)
    if meta.perm is not None:
        qg = qg.index_select(0, meta.perm)
    acc = torch.empty(b, hkv, g, d, dtype=torch.float32)  # [B, Hkv, G, D] in trie order
    lse = torch.empty(b, hkv, g, dtype=torch.float32)
    for t in meta.tails:
        qt = qg if t.rows is None else qg.index_select(0, t.rows)
        n = qt.shape[0]
        # Tails, one row each: [n * nt, bs, Hkv, D] -> [n, Hkv, nt * bs, D].
        keys = torch.index_select(k_cache, 0, t.block_ids, out=t.k_buf).view(n, -1, hkv, d).transpose(1, 2)
        vals = torch.index_select(v_cache, 0, t.block_ids, out=t.v_buf).view(n, -1, hkv, d).transpose(1, 2)
        out, out_lse = attend_with_lse(qt, keys, vals, t.mask, scale)
        if t.rows is None:
            acc.copy_(out)
            lse.copy_(out_lse)
        else:
            acc.index_copy_(0, t.rows, out.float())
            lse.index_copy_(0, t.rows, out_lse)
    for (lo, hi), blocks in zip(meta.seg_ranges, meta.seg_blocks, strict=True):
        # The prefix KV, read once for all r rows: [nb, bs, Hkv, D] -> [1, Hkv, L, D].
        kp = _blocks(k_cache, blocks).flatten(0, 1).transpose(0, 1)[None]
        vp = _blocks(v_cache, blocks).flatten(0, 1).transpose(0, 1)[None]
        r = hi - lo
        # [r, Hkv, G, D] -> [1, Hkv, r * G, D]: query rows ordered (row, g).
        qs = qg[lo:hi].transpose(0, 1).reshape(1, hkv, r * g, d)
        o, o_lse = attend_with_lse(qs, kp, vp, None, scale)
        o32 = o.view(hkv, r, g, d).transpose(0, 1).float()
        merge_into(acc[lo:hi], lse[lo:hi], o32, o_lse.view(hkv, r, g).transpose(0, 1))
    if meta.perm is not None:
        acc = torch.empty_like(acc).index_copy_(0, meta.perm, acc)
    return acc.to(q.dtype).reshape(b, hq * d)
