"""Contexts: the engine-side token sequences, their block tables and fork relations.

Progress of a context is two counters (as in vLLM v1): `tokens` (what the context should hold)
and `num_computed` (how many of them have KV in the cache). An Extend's tokens are appended, then
its generation's sampled tokens, and every step moves `num_computed` forward; prefix hits, chunked prefill and decode
share this one path.

Block-table invariant: `block_table` covers at least `num_computed` slots; slot i of the context
lives in block `block_table[i // block_size]` at offset `i % block_size`. A block listed by two
contexts is never written: the writer copies it first (copy-on-write), so a child never sees slots
its parent fills later and a parent never sees its children's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from parrot.engine.kv.block_pool import BlockPool
from parrot.protocol.errors import not_found


@dataclass
class Context:
    context_id: str
    parent_id: str | None
    tokens: list[int] = field(default_factory=list)
    num_computed: int = 0
    block_table: list[int] = field(default_factory=list)
    freed: bool = False
    last_used: float = 0.0  # monotonic time its last job ended (reclaim order of idle contexts)

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class BlockCopy:
    """Copy the first `num_slots` slots of block `src` into block `dst` (applied to the tensors)."""

    src: int
    dst: int
    num_slots: int


class ContextTable:
    """Creates, forks, grows and frees contexts over one `BlockPool`. Not thread-safe."""

    def __init__(self, pool: BlockPool, block_size: int) -> None:
        self.pool = pool
        self.block_size = block_size
        self.contexts: dict[str, Context] = {}
        self.releasing: set[str] = set()  # freed while in use: `free_released` frees them later

    def __contains__(self, context_id: object) -> bool:
        return context_id in self.contexts

    def get(self, context_id: str) -> Context:
        return self.contexts[context_id]

    def create(self, context_id: str, parent: Context | None = None) -> Context:
        """A new context; a fork shares every parent block that holds computed KV (no copy)."""
        if context_id in self.contexts:
            raise KeyError(f"context {context_id!r} exists")
        ctx = Context(context_id, parent.context_id if parent else None)
        if parent is not None:
            ctx.tokens = list(parent.tokens)
            ctx.num_computed = parent.num_computed
            shared = parent.block_table[: self.blocks_for(parent.num_computed)]
            self.pool.incref(shared)
            ctx.block_table = list(shared)
        self.contexts[context_id] = ctx
        return ctx

    def blocks_for(self, num_slots: int) -> int:
        return -(-num_slots // self.block_size)

    def blocks_needed(self, ctx: Context, end: int) -> int:
        """Blocks to allocate so slots [num_computed, end) can be written."""
        need = max(0, self.blocks_for(end) - len(ctx.block_table))
        if ctx.num_computed % self.block_size and self._shared_tail(ctx):
            need += 1  # copy-on-write of the partly filled last block
        return need

    def _shared_tail(self, ctx: Context) -> bool:
        idx = ctx.num_computed // self.block_size
        return idx < len(ctx.block_table) and self.pool.ref_count(ctx.block_table[idx]) > 1

    def reserve(self, ctx: Context, end: int) -> list[BlockCopy]:
        """Make slots [num_computed, end) writable. Raises OutOfBlocks and changes nothing then."""
        copies: list[BlockCopy] = []
        n_new = self.blocks_needed(ctx, end)
        if n_new == 0:
            return copies
        fresh = self.pool.allocate(n_new)
        if ctx.num_computed % self.block_size and self._shared_tail(ctx):
            idx = ctx.num_computed // self.block_size
            dst = fresh.pop(0)
            copies.append(BlockCopy(ctx.block_table[idx], dst, ctx.num_computed % self.block_size))
            self.pool.decref([ctx.block_table[idx]])
            ctx.block_table[idx] = dst
        ctx.block_table.extend(fresh)
        return copies

    def truncate_to_shared(self, ctx: Context) -> int:
        """Preemption: keep the leading full blocks other contexts also hold, drop the rest.

        Returns the number of blocks returned to the pool. The dropped tokens are recomputed later.
        """
        keep = 0
        bs = self.block_size
        while (
            keep < len(ctx.block_table)
            and (keep + 1) * bs <= ctx.num_computed
            and self.pool.ref_count(ctx.block_table[keep]) > 1
        ):
            keep += 1
        before = self.pool.num_free
        self.pool.decref(ctx.block_table[keep:])
        del ctx.block_table[keep:]
        ctx.num_computed = min(ctx.num_computed, keep * bs)
        return self.pool.num_free - before

    def truncate(self, ctx: Context, num_tokens: int) -> None:
        """Cut the context back to its first `num_tokens` tokens (a generation that ended on a stop
        string): their KV stays, the blocks no remaining computed slot uses go back to the pool."""
        del ctx.tokens[num_tokens:]
        ctx.num_computed = min(ctx.num_computed, num_tokens)
        keep = self.blocks_for(ctx.num_computed)
        self.pool.decref(ctx.block_table[keep:])
        del ctx.block_table[keep:]

    def uncompute_last(self, ctx: Context) -> None:
        """Mark the context's last token as not computed (its KV slot is written again when it is)."""
        last = ctx.tokens[-1]
        self.truncate(ctx, len(ctx.tokens) - 1)
        ctx.tokens.append(last)

    def check_live(self, context_id: str, parent_id: str | None) -> None:
        """A context being freed takes no new work: 404, as if it were gone already."""
        if context_id in self.releasing:
            raise not_found("context", context_id, "context_id")
        if parent_id is not None and parent_id in self.releasing:
            raise not_found("parent context", parent_id, "parent_context_id")

    def free_released(self, in_use: Callable[[str], bool]) -> None:
        """Free the contexts in `releasing` that are no longer `in_use`."""
        for context_id in [c for c in self.releasing if not in_use(c)]:
            self.releasing.discard(context_id)
            ctx = self.contexts.get(context_id)
            if ctx is not None:  # gone already: a fork's placeholder whose fork failed
                self.free(ctx)

    def free(self, ctx: Context) -> None:
        self.pool.decref(ctx.block_table)
        ctx.block_table = []
        ctx.freed = True
        del self.contexts[ctx.context_id]
