"""One native call per decoder layer of a float32 decode step: `parrot_decoder_layer_f32`
(block_kernels.c; the sequence is csrc/decoder_layer.h, shared with the bf16 layer) runs the per-op
float32 path's kernels (blocks.py's linears, ops.py's RMSNorm, RoPE and SiLU*up, decode.py's cascade
attention, the cache write) in its order over the same buffer layouts, so its outputs are that
path's bits.

Why: on an AVX2 CPU a one-row decode step of SmolLM2-135M spent about as long in Python as in the
kernels (cProfile: ~9 ms of the linears' native time and ~9 ms of dispatch, ~10 ctypes calls,
views, splits, the cache write's two index_copy_ and an output allocation per op, for each of 30
layers). Fused, a layer is one ctypes call with the GIL released for all of it.

It takes a step whose attention says it attends decode rows only on the float32 cascade kernel
(`Float32DecodeRows`, from the backend's `native_rows()`), with every linear on the block kernels
at this row count (blocks.MAX_ROWS, or any count when row-invariant) and the norms, SiLU*up and
rotary native; anything else runs the layer's per-op path.

Ownership as in fused.py: one `Float32Step` per model (fused_step.py's `StepDescriptor`: the
step's descriptor, scratch and output buffers), and one `Float32Layer` per decoder layer (its
descriptor, rebuilt when a piece or a weight changes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from parrot.engine.kernels import blocks, library, ops
from parrot.engine.kernels.decode import CascadePieces
from parrot.engine.kernels.fused_step import StepDescriptor
from parrot.engine.kernels.pieces import NativeRMSNorm, NativeSiluMul
from parrot.engine.model.config import ModelConfig
from parrot.engine.model.layers import RMSNorm
from parrot.engine.model.llama import DecoderLayer
from parrot.engine.model.rope import RotaryStep

KIND = {"q4_1": 0, "q8_0": 1}  # the linears' kind codes of parrot_decoder_layer_f32


@dataclass(frozen=True)
class Float32DecodeRows:
    """A step of decode rows only that `PagedAttention.forward` would write to their slots and
    attend on `kernels.cascade_decode` over `pieces` (valid for its step)."""

    k_cache: torch.Tensor  # [layers, blocks, block_size, Hkv, D] float32
    v_cache: torch.Tensor
    slot_mapping: torch.Tensor  # [N] int64
    pieces: CascadePieces
    scale: float


def _f32(t: torch.Tensor | None, *shape: int) -> bool:
    return (
        t is not None
        and t.dtype == torch.float32
        and t.device.type == "cpu"
        and t.is_contiguous()
        and (not shape or t.shape == shape)
    )


class Float32Step(StepDescriptor[Float32DecodeRows]):
    """The step descriptor (fused_step.py; attention slots `ST_PIECES` .. of block_kernels.c) and
    buffers, shared by a model's layers."""

    DTYPE = torch.float32

    def attention_fields(self, cfg: ModelConfig, rows: Float32DecodeRows) -> tuple[list[int], list[torch.Tensor]]:
        p = rows.pieces  # (held by rows, which the descriptor's key holds)
        return [p.lens.numel(), *(t.data_ptr() for t in p.arrays())], []

    def takes(self, cfg: ModelConfig, rotary: RotaryStep, rows: Float32DecodeRows, n: int) -> bool:
        hkv, d = cfg.num_kv_heads, cfg.head_dim
        k, cos, sin, p = rows.k_cache, rotary.cos_table, rotary.sin_table, rows.pieces
        return (
            isinstance(rotary, ops.NativeRotaryStep)
            and n > 0
            and d % 32 == 0  # RoPE's kernel (ops.NativeRotaryStep)
            and k.dim() == 5
            and k.shape[3:] == (hkv, d)
            and _f32(k)
            and _f32(rows.v_cache, *k.shape)
            and rows.slot_mapping.dtype == torch.int64
            and rows.slot_mapping.is_contiguous()
            and rows.slot_mapping.shape == (n,)
            and rotary.positions.dtype == torch.int64
            and rotary.positions.is_contiguous()
            and rotary.positions.shape == (n,)
            and _f32(cos)
            and cos.dim() == 2
            and cos.shape[1] == d
            and _f32(sin, *cos.shape)
            and p.slot_ptr.numel() == n + 1
            and all(t.dtype == torch.int64 and t.is_contiguous() for t in p.arrays())
        )


class Float32Layer:
    """One decoder layer's descriptor (`FL_*` of block_kernels.c) and its float32 fused call."""

    def __init__(self) -> None:
        self.step = Float32Step()  # replaced by the model's shared one in `fused.share_steps`
        self.key: tuple[object, ...] | None = None
        self.desc: torch.Tensor | None = None
        self.held: list[torch.Tensor] = []  # what desc points into (the block codes and scales)
        self.eps = (0.0, 0.0)

    def run(
        self,
        layer: DecoderLayer,
        idx: int,
        x: torch.Tensor,
        h: torch.Tensor,
        rotary: RotaryStep,
        rows: Float32DecodeRows,
        next_norm: RMSNorm,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The layer in one native call, or None where the per-op path must run it."""
        lib = library.blocks_library()
        cfg = layer.cfg
        n = x.shape[0]
        if lib is None or not (_f32(x, n, cfg.hidden_size) and _f32(h, n, cfg.hidden_size)):
            return None
        desc = self._desc(layer, n, next_norm)
        step = self.step.get(cfg, rotary, rows, n) if desc is not None else None
        if desc is None or step is None:
            return None
        x_out, h_out = self.step.out_ptrs[idx % 2]
        args = (desc.data_ptr(), step.data_ptr(), idx, x.data_ptr(), h.data_ptr(), next_norm.weight.data_ptr())
        failed = lib.parrot_decoder_layer_f32(*args, x_out, h_out, *self.eps, rows.scale)
        if failed:
            raise MemoryError(f"fused decoder layer: {failed} attention work items could not allocate their buffers")
        out = self.step.outs[idx % 2]
        if idx == cfg.num_layers - 1:
            self.step.release()  # the pass is done: its buffers go now, not at the next step
        return out

    def _desc(self, layer: DecoderLayer, n: int, next_norm: RMSNorm) -> torch.Tensor | None:
        m = layer._modules
        pieces = (m["qkv"], m["o"], m["gate_up"], m["down"], m["post_attn_norm"], m["silu_mul"], next_norm)
        params = [p._parameters.get(name) for p in pieces for name in ("weight", "bias") if p is not None]
        invariant = all(getattr(p, "ROW_INVARIANT", False) for p in pieces[:4])
        fingerprint = (
            n <= blocks.MAX_ROWS or invariant,
            *pieces,
            *((t.data_ptr(), t._version) for t in params if t is not None),
        )
        if fingerprint != self.key:
            self.key, self.desc = fingerprint, self._build(layer, next_norm) if fingerprint[0] else None
        return self.desc

    def _build(self, layer: DecoderLayer, next_norm: RMSNorm) -> torch.Tensor | None:
        hidden, inter = layer.cfg.hidden_size, layer.cfg.intermediate_size
        norm, silu = layer.post_attn_norm, layer.silu_mul
        if not (isinstance(norm, NativeRMSNorm) and isinstance(next_norm, NativeRMSNorm)):
            return None
        if not (isinstance(silu, NativeSiluMul) and _f32(norm.weight, hidden) and _f32(next_norm.weight, hidden)):
            return None
        if hidden % 16 or (2 * inter) % 32:  # the norms' and SiLU*up's kernels (ops.py)
            return None
        fields: list[int] = []
        held: list[torch.Tensor] = [norm.weight, next_norm.weight]
        for lin in (layer.qkv, layer.o, layer.gate_up, layer.down):
            encoded = lin.encoded.get(lin.weight) if isinstance(lin, blocks.BlockLinear) else None
            if encoded is None or encoded.in_features > blocks.MAX_K:
                return None
            bias = lin.bias
            if bias is not None and not _f32(bias, encoded.out_features):
                return None
            fields += [KIND[encoded.kind], encoded.qs.data_ptr(), encoded.scales.data_ptr()]
            fields.append(0 if bias is None else bias.data_ptr())
            held += [encoded.qs, encoded.scales] + ([] if bias is None else [bias])
        self.held = held
        self.eps = (norm.eps, next_norm.eps)
        return torch.tensor([*fields, norm.weight.data_ptr()], dtype=torch.int64)
