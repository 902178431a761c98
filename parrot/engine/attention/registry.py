"""Attention backends by name; the engine config picks one."""

from __future__ import annotations

from collections.abc import Callable

from parrot.engine.attention.base import PagedAttention
from parrot.engine.kv.cache import KVCache

BackendFactory = Callable[[KVCache, int, int, int], PagedAttention]
_BACKENDS: dict[str, BackendFactory] = {"paged": PagedAttention}


def register_backend(name: str, factory: BackendFactory) -> None:
    _BACKENDS[name] = factory


def make_backend(name: str, cache: KVCache, num_heads: int, num_kv_heads: int, head_dim: int) -> PagedAttention:
    if name not in _BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; known: {sorted(_BACKENDS)}")
    return _BACKENDS[name](cache, num_heads, num_kv_heads, head_dim)


import parrot.engine.attention.shared_prefix_backend  # noqa: E402, F401  (registers "shared_prefix", "triton_shared_prefix")
