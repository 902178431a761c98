"""Paged KV cache: the block pool (ids and reference counts), contexts and the cache tensors."""
