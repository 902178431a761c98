"""Reference-counted pool of fixed-size KV blocks (ids only; the tensors live in `KVCache`).

Owned by the engine loop thread. A block is free exactly when its reference count is zero; a
context's block table holds one reference to each block it lists.
"""

from __future__ import annotations


class OutOfBlocks(Exception):
    """Raised when an allocation cannot be satisfied; the caller waits or preempts."""


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError("num_blocks must be >= 1")
        self.num_blocks = num_blocks
        self._ref = [0] * num_blocks
        # A stack: the most recently freed block is reused first (its memory is warm).
        self._free = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def ref_count(self, block_id: int) -> int:
        return self._ref[block_id]

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfBlocks(f"need {n} blocks, {len(self._free)} free")
        out = [self._free.pop() for _ in range(n)]
        for b in out:
            self._ref[b] = 1
        return out

    def incref(self, blocks: list[int]) -> None:
        for b in blocks:
            if self._ref[b] <= 0:
                raise AssertionError(f"incref of free block {b}")
            self._ref[b] += 1

    def decref(self, blocks: list[int]) -> None:
        for b in blocks:
            if self._ref[b] <= 0:
                raise AssertionError(f"decref of free block {b}")
            self._ref[b] -= 1
            if self._ref[b] == 0:
                self._free.append(b)
