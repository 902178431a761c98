"""Paged KV accounting of a simulated engine: block ids, reference counts, forks, copy-on-write,
frees and reclaim. No tensors: a block is an id, a context two counters and a block table.

As in the builtin engine (parrot/engine/kv/context.py): a context's progress is `num_tokens` (what
it should hold) and `num_computed` (how many have KV); its block table covers `num_computed`
slots. A fork shares every full block of its parent's computed KV (reference counted, no copy);
a partly filled last block is copied into a new block (copy-on-write), so neither side ever sees
the other's later slots. A block returns to the free list when no context refers to it.

Shared-prefix grouping: each context remembers the root of its fork tree and how many tokens of
KV it shares with it (`shared_len`), so decode rows of one root are one group whose shared prefix
the cost model reads once.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class OutOfBlocks(Exception):
    """Not enough free blocks for the request (the scheduler reclaims or preempts, then retries)."""


@dataclass
class SimContext:
    context_id: str
    root_id: str  # the root of its fork tree (itself when not a fork)
    shared_len: int = 0  # tokens of KV shared with its fork tree at the fork (full blocks)
    num_tokens: int = 0
    num_computed: int = 0
    blocks: list[int] = field(default_factory=list)
    busy: bool = False  # a job runs on it (a free answers 409)
    last_used: float = 0.0  # virtual time its last job ended (reclaim order)


class BlockTable:
    """Reference-counted blocks and the contexts that hold them. Not thread-safe (one event loop)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() hands out 0, 1, 2, ...
        self.refs = [0] * num_blocks
        self.contexts: dict[str, SimContext] = {}
        self.num_copies = 0  # copy-on-write block copies (forks of a partly filled block)

    @property
    def num_free(self) -> int:
        return len(self.free)

    def blocks_for(self, ctx: SimContext, num_new: int) -> int:
        """Blocks `ctx` needs to compute `num_new` more tokens."""
        bs = self.block_size
        return -(-(ctx.num_computed + num_new) // bs) - len(ctx.blocks)

    def _take(self) -> int:
        block = self.free.pop()
        self.refs[block] = 1
        return block

    def _drop(self, block: int) -> None:
        self.refs[block] -= 1
        if self.refs[block] == 0:
            self.free.append(block)

    def create(self, context_id: str, parent: SimContext | None = None) -> SimContext:
        """A new context; a fork shares the parent's full computed blocks and copies a partial one."""
        ctx = SimContext(context_id, root_id=context_id)
        self.contexts[context_id] = ctx
        if parent is not None:
            ctx.num_tokens = parent.num_tokens
            self.share(ctx, parent)
        return ctx

    def share(self, ctx: SimContext, parent: SimContext) -> int:
        """Make the empty `ctx` a fork of `parent`'s computed KV: full blocks shared, a partly filled
        last block copied (without a free block for the copy, the fork shares the full blocks
        only). Returns the tokens of KV the fork took over."""
        assert not ctx.blocks and ctx.num_computed == 0
        num_full = parent.num_computed // self.block_size
        partial = parent.num_computed % self.block_size
        ctx.root_id = parent.root_id
        ctx.shared_len = num_full * self.block_size
        ctx.blocks = parent.blocks[:num_full]
        for block in ctx.blocks:
            self.refs[block] += 1
        ctx.num_computed = ctx.shared_len
        if partial and self.free:
            ctx.blocks.append(self._take())
            ctx.num_computed += partial
            self.num_copies += 1
        return ctx.num_computed

    def compute(self, ctx: SimContext, num_new: int) -> None:
        """Give `ctx` the blocks for `num_new` more computed tokens, then count them computed.
        Raises OutOfBlocks (nothing changed) when the free list is short."""
        need = self.blocks_for(ctx, num_new)
        if need > len(self.free):
            raise OutOfBlocks(ctx.context_id)
        if ctx.blocks and ctx.num_computed % self.block_size and self.refs[ctx.blocks[-1]] > 1:
            raise AssertionError("a shared block is never partly filled")  # forks copy partial blocks
        for _ in range(need):
            ctx.blocks.append(self._take())
        ctx.num_computed += num_new

    def release(self, ctx: SimContext) -> int:
        """Drop the context's KV (its tokens stay; it recomputes them when used): returns the
        blocks that became free."""
        before = len(self.free)
        for block in ctx.blocks:
            self._drop(block)
        ctx.blocks = []
        ctx.num_computed = 0
        ctx.shared_len = 0
        return len(self.free) - before

    def remove(self, context_id: str) -> None:
        ctx = self.contexts.pop(context_id)
        self.release(ctx)

    def reclaim_idle(self, num_needed: int, keep: set[str]) -> int:
        """Release idle contexts (no job, not in `keep`), least recently used first, until
        `num_needed` blocks are free or none is left; returns the blocks freed."""
        freed = 0
        for ctx in sorted(self.contexts.values(), key=lambda c: c.last_used):
            if len(self.free) >= num_needed:
                break
            if ctx.busy or ctx.context_id in keep or not ctx.blocks:
                continue
            freed += self.release(ctx)
        return freed
