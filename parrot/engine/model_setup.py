"""What the engine derives from its model and config: the transforms a loaded model gets (the
native CPU kernels if asked and built, the batch-invariant mode) and the attention backend that
goes with them, the EOS ids, the number of KV blocks."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from parrot.engine import kernels
from parrot.engine.attention.base import PagedAttention
from parrot.engine.attention.registry import make_backend
from parrot.engine.config import EngineConfig
from parrot.engine.kv.cache import KVCache
from parrot.engine.model.config import ModelConfig
from parrot.engine.model.llama import LlamaModel
from parrot.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelSetup:
    native: bool  # the native kernels run the model (the backend and sampler use them too)
    native_attention: bool  # the attention backend attends on native kernels where they take its cache
    native_kernels: str  # what EngineStats.native_kernels reports
    batch_invariant: bool
    attention: str  # the attention backend's registry name

    def backend(self, cache: KVCache, mc: ModelConfig) -> PagedAttention:
        """The attention backend over `cache` this setup names, native where it attends natively."""
        return make_backend(self.attention, cache, mc.num_heads, mc.num_kv_heads, mc.head_dim, self.native_attention)


def set_up_model(model: LlamaModel, config: EngineConfig, dtype: torch.dtype) -> ModelSetup:
    """Apply the configured transforms to `model`, once; logs what runs (or why not)."""
    chosen = kernels.apply_engine_kernels(model, model.cfg, config.cpu_kernels)  # logs what runs
    native = chosen.native
    if config.cpu_kernels and not native and config.dtype == "bfloat16":
        # A float32 model is a choice (bit-exact runs); a bf16 one without the kernels is news.
        log.warning("native CPU kernels %s; running on torch ops", chosen.status)
    mc = model.cfg  # auto: on where the kernels run the linears and the attention too
    auto = native and kernels.paged_decode_supported(dtype, mc.num_heads, mc.num_kv_heads, mc.head_dim)
    batch_invariant = auto if config.batch_invariant is None else config.batch_invariant
    if batch_invariant:  # row-invariant linears; every row through one per-row attention kernel
        kernels.apply_batch_invariant(model)
        log.info("batch-invariant mode: row-invariant linears, rowwise attention (not %r)", config.attention)
    attention = "rowwise" if batch_invariant else config.attention
    # A float32 cache decodes on the AVX2 kernels (block_kernels.c) whatever ran the linears.
    native_attention = native or (dtype == torch.float32 and config.cpu_kernels)
    return ModelSetup(native, native_attention, chosen.status, batch_invariant, attention)


def eos_ids(mc: ModelConfig, tokenizer: Tokenizer) -> frozenset[int]:
    """The model's EOS ids and the tokenizer's."""
    eos = set(mc.eos_token_ids)
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    return frozenset(eos)


def num_kv_blocks(mc: ModelConfig, kv_cache_bytes: int, block_size: int, dtype: torch.dtype) -> int:
    """How many KV blocks fit in `kv_cache_bytes` (at least one)."""
    per_block = KVCache.bytes_per_block(mc.num_layers, block_size, mc.num_kv_heads, mc.head_dim, dtype)
    return max(1, kv_cache_bytes // per_block)
