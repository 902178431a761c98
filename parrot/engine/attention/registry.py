"""Attention backends by name: a plain table of the implementations; the engine config picks one.

The table imports its implementations; they never import it (no registration side effects), so
the names are known as soon as this module is imported.
"""

from __future__ import annotations

from collections.abc import Callable

from parrot.engine.attention.base import PagedAttention
from parrot.engine.attention.rowwise import RowwiseAttention
from parrot.engine.attention.shared_prefix_backend import TritonSharedPrefixAttention, make_shared_prefix
from parrot.engine.kv.cache import KVCache

# factory(cache, num_heads, num_kv_heads, head_dim, native) -> backend; `native`: decode on the
# native CPU kernels where they take the cache (see PagedAttention).
BackendFactory = Callable[[KVCache, int, int, int, bool], PagedAttention]
_BACKENDS: dict[str, BackendFactory] = {
    PagedAttention.name: PagedAttention,
    RowwiseAttention.name: RowwiseAttention,  # every row per row: the batch-invariant mode's
    "shared_prefix": make_shared_prefix,  # picks the implementation by the cache's device
    TritonSharedPrefixAttention.name: TritonSharedPrefixAttention,
}


def backend_names() -> list[str]:
    """The names `make_backend` (and `EngineConfig.attention`) accepts, sorted."""
    return sorted(_BACKENDS)


def make_backend(
    name: str, cache: KVCache, num_heads: int, num_kv_heads: int, head_dim: int, native: bool = False
) -> PagedAttention:
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; known: {backend_names()}")
    return _BACKENDS[name](cache, num_heads, num_kv_heads, head_dim, native)
