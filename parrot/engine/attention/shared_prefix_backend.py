"""Shared-prefix attention backends: `PagedAttention` with cascade decode rows.

`SharedPrefixAttention` ("shared_prefix", CPU) groups the step's decode rows by shared prefix
blocks once per step (`prepare_decode`) and, when some group pays (at least `min_group_size` rows
sharing at least `min_shared_tokens` tokens), attends each shared prefix once for the whole group
(the native `kernels.cascade_decode` when the backend decodes natively, else the torch
`cascade_decode`); otherwise it is exactly the per-context path. Prefill rows are untouched.

`TritonSharedPrefixAttention` ("triton_shared_prefix") runs the same plan with the Triton kernels
of `triton_kernels.py` (imported when the backend is built, so CPU engines never load triton); it
needs the KV cache on a CUDA device, or `TRITON_INTERPRET=1` set before triton's import (tests).

Both own their step metadata (`pieces`, `cascade`, `triton_meta`), valid until the next `prepare`.
The attention registry names both; "shared_prefix" (`make_shared_prefix`) picks the
implementation by the KV cache's device (CPU: native or PyTorch; CUDA: Triton).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from parrot.engine import kernels
from parrot.engine.attention.base import PagedAttention, SeqSpec
from parrot.engine.attention.shared_prefix import (
    CascadeMeta,
    GroupingConfig,
    SharedPrefixPlan,
    cascade_decode,
    plan_shared_prefixes,
)
from parrot.engine.kv.cache import KVCache

if TYPE_CHECKING:
    from parrot.engine.attention import triton_kernels


# With native decode, a group decodes on the native cascade (kernels.cascade_decode), which
# pays from about 4 rows x 512 shared tokens: attention us per layer, native per-row vs native
# cascade vs torch cascade (bf16, 2 threads): 4 x 512: 75 / 74 / -, 6 x 1024: 260 / 235 / 566,
# 16 x 1024: 879 / 507 / 632, 8 x 4096: 1785 / 963 / 1227, 64 x 1024: 2297 / 1927 / 1541.
NATIVE_GROUPING = GroupingConfig(min_group_size=4, min_shared_tokens=512)


class SharedPrefixAttention(PagedAttention):
    name = "shared_prefix"

    def __init__(
        self,
        cache: KVCache,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        native: bool = False,
        grouping: GroupingConfig | None = None,
    ) -> None:
        super().__init__(cache, num_heads, num_kv_heads, head_dim, native)
        self.grouping = grouping  # None: chosen per step (NATIVE_GROUPING when native decode is on)
        self.plan: SharedPrefixPlan | None = None  # None: this step decodes per context
        self.cascade: CascadeMeta | None = None  # the torch cascade's step tensors
        self.pieces: kernels.CascadePieces | None = None  # the native cascade's (native decode on)
        self.num_shared_steps = 0  # steps that took the shared path (observability, tests)

    def step_grouping(self) -> GroupingConfig:
        if self.grouping is not None:
            return self.grouping
        return NATIVE_GROUPING if self.native else GroupingConfig()

    def prepare_decode(self, seqs: list[SeqSpec]) -> None:
        self.plan = self.cascade = self.pieces = self.decode_pieces = None
        grouping = self.step_grouping()
        if len(seqs) >= grouping.min_group_size:
            plan = plan_shared_prefixes(
                [s.block_table for s in seqs], [s.seq_len for s in seqs], self.cache.block_size, grouping
            )
            if plan.segments:
                self.plan = plan
                self.num_shared_steps += 1
                if self.native:
                    self.pieces = native_pieces(plan, self.cache.block_size)
                else:
                    self.prepare_shared(plan)
                return
        super().prepare_decode(seqs)

    def prepare_shared(self, plan: SharedPrefixPlan) -> None:
        self.cascade = CascadeMeta.build(
            plan, self.cache.block_size, self.num_kv_heads, self.head_dim, self.cache.k.dtype
        )

    def native_decode_pieces(self) -> kernels.CascadePieces | None:
        if self.pieces is not None:
            return self.pieces
        return None if self.cascade is not None else super().native_decode_pieces()

    def decode(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        if self.pieces is not None:
            return kernels.cascade_decode(q, self.cache.k[layer], self.cache.v[layer], self.pieces, self.scale)
        if self.cascade is None:
            return super().decode(layer, q)
        return cascade_decode(q, self.cache.k[layer], self.cache.v[layer], self.cascade, self.scale)


def native_pieces(plan: SharedPrefixPlan, block_size: int, piece_tokens: int = 256) -> kernels.CascadePieces:
    """The plan as the native kernel's pieces: each segment once, in runs of about `piece_tokens`
    (work items the threads share evenly), then each row's tail."""
    per_piece = max(1, piece_tokens // block_size)
    pieces = []
    for seg in plan.segments:
        for i in range(0, len(seg.block_ids), per_piece):
            blocks = list(seg.block_ids[i : i + per_piece])
            pieces.append((list(seg.rows), blocks, len(blocks) * block_size))
    for row in range(len(plan.tail_lens)):
        blocks, num_tokens = plan.tail(row)
        pieces.append(([row], blocks, num_tokens))
    return kernels.CascadePieces.build(pieces, len(plan.tail_lens))


# On a GPU the cascade costs a few microseconds more per layer than the same kernels run per
# context (more launches, the merge), so a group pays only where reading its prefix once spares
# reads worth more than that: on an H200, from ~48 MB of K and V reads per layer (graph-timed, 30 bf16
# shapes of 4-64 rows over 1,024-8,192 tokens, two head layouts: at 44 MB and below 0.6-0.9x the
# per-context kernels, at 47 MB 1.0x, from 49 MB 1.1-3.7x; benchmarks/attention/gpu.py --sweep,
# bench_results/attention-gpu-h200/sweep/).
TRITON_MIN_SAVED_BYTES = 48_000_000


def triton_grouping(num_kv_heads: int, head_dim: int, element_size: int) -> GroupingConfig:
    """The Triton backend's grouping for one layer's KV layout: a segment must spare
    TRITON_MIN_SAVED_BYTES of K and V reads."""
    bytes_per_token = 2 * num_kv_heads * head_dim * element_size
    return GroupingConfig(min_saved_tokens=-(-TRITON_MIN_SAVED_BYTES // bytes_per_token))


class TritonSharedPrefixAttention(SharedPrefixAttention):
    name = "triton_shared_prefix"

    def __init__(
        self,
        cache: KVCache,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        native: bool = False,
        grouping: GroupingConfig | None = None,
    ) -> None:
        """`native` is accepted for the registry's signature and ignored: the Triton kernels decode every row."""
        from parrot.engine.attention import triton_kernels

        reason = triton_kernels.unavailable_reason(cache.k.device)
        if reason is not None:
            raise ValueError(f"attention backend {self.name!r}: {reason}; use 'shared_prefix' on the CPU")
        if grouping is None:
            grouping = triton_grouping(num_kv_heads, head_dim, cache.k.element_size())
        super().__init__(cache, num_heads, num_kv_heads, head_dim, False, grouping)
        self.kernels = triton_kernels
        self.triton_meta: triton_kernels.TritonCascadeMeta | None = None

    def prepare_decode(self, seqs: list[SeqSpec]) -> None:
        self.triton_meta = None
        super().prepare_decode(seqs)
        if seqs and self.plan is None:
            # No group pays: the same kernels run as a plain paged decode (every row is a tail).
            plan = plan_shared_prefixes(
                [s.block_table for s in seqs], [s.seq_len for s in seqs], self.cache.block_size, _NEVER_GROUP
            )
            self.prepare_shared(plan)

    def prepare_shared(self, plan: SharedPrefixPlan) -> None:
        self.triton_meta = self.kernels.TritonCascadeMeta.build(
            plan, self.cache.block_size, self.num_groups, self.cache.k.device
        )

    def decode(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        assert self.triton_meta is not None, "decode before prepare"
        return self.kernels.cascade_decode(q, self.cache.k[layer], self.cache.v[layer], self.triton_meta, self.scale)


# A grouping no batch satisfies: every row attends its whole KV as its tail.
_NEVER_GROUP = GroupingConfig(min_group_size=1 << 30, min_shared_tokens=1 << 30)


def make_shared_prefix(
    cache: KVCache, num_heads: int, num_kv_heads: int, head_dim: int, native: bool = False
) -> PagedAttention:
    """The "shared_prefix" backend for the cache's device: the Triton kernels on CUDA, else the
    CPU one (native decode when `native` and the kernels take the cache, else PyTorch)."""
    cls = TritonSharedPrefixAttention if cache.k.device.type == "cuda" else SharedPrefixAttention
    return cls(cache, num_heads, num_kv_heads, head_dim, native)
