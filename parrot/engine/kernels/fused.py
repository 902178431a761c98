"""One native call per decoder layer: `FusedDecoderLayer` runs a whole layer of a step in
`parrot_decoder_layer` (cpu_kernels.c), which composes the same kernels as the per-op native path
in the same order, rounding at the same points, so its outputs are that path's bits.

Why: on the per-op path a decode step's forward pass of SmolLM2-135M is 271 ctypes calls (4
linears, RoPE, attention, 2 norms and SiLU*up per layer) and ~1,400 aten calls (splits, views, the
cache write's index_copy_, an output allocation per op), each with Python dispatch and argument
marshalling, each ctypes call taking the GIL back; fused, Python makes one call per layer and the
GIL is free for the whole layer (ctypes releases it).

It takes a step when every piece of it is native and the step's attention says its rows attend
through the native paged kernels (`NativeRows`, which the attention backend returns from
`native_rows()`: the rowwise backend always, its prefill chunks on `paged_prefill`; the paged
backend for steps of decode rows only), with the linears on one kernel: the batch-invariant
kernel (AMX, else VNNI) at any row count, or the dot kernel at up to DOT_MAX_ROWS rows (a float32
model's decode steps: fused_f32.py). Anything else (torch pieces, prefill chunks on the paged
backend, the shared-prefix cascade, the AMX or oneDNN row counts outside that mode, odd shapes,
autograd) runs the layer's per-op path. `set_fused(model, False)` turns a model's fused layers
off (A/B runs).

Ownership: `FusedStep` (fused_step.py's `StepDescriptor`: one per model, shared by its layers)
holds the step's descriptor, scratch and output buffers; each layer holds its own descriptor
(`LY_*` of cpu_kernels.c), rebuilt when a piece, a weight or its packed copy changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from parrot.engine.kernels import library, ops
from parrot.engine.kernels.decode import paged_decode_supported
from parrot.engine.kernels.fused_f32 import Float32DecodeRows, Float32Layer
from parrot.engine.kernels.fused_step import StepDescriptor
from parrot.engine.kernels.pieces import NativeLinear, NativeRMSNorm, NativeSiluMul
from parrot.engine.model.config import ModelConfig
from parrot.engine.model.layers import RMSNorm
from parrot.engine.model.llama import AttendFn, DecoderLayer
from parrot.engine.model.rope import RotaryStep

LINEAR_VNNI, LINEAR_DOT, LINEAR_AMX = 0, 1, 2  # the LY_LINEAR_KIND values of cpu_kernels.c


@dataclass(frozen=True)
class NativeRows:
    """A step whose rows attend through the native paged kernels over their own KV: the leading
    rows one by one (`paged_decode`), then each prefill chunk (`paged_prefill`, the same bits per
    row): what the attention backend would do in `forward`, as data (valid for its step)."""

    k_cache: torch.Tensor  # [layers, blocks, block_size, Hkv, D]
    v_cache: torch.Tensor
    slot_mapping: torch.Tensor  # [N] int64: each row's new K/V slot
    tables: torch.Tensor  # [N, max_blocks] int64
    lens: torch.Tensor  # [N] int64: row i attends to keys [0, lens[i])
    scale: float
    # [C, 3] int64 (first row, rows, sequence length) of each prefill chunk, in row order, covering
    # the rows after the per-row ones; None: every row one by one.
    chunks: torch.Tensor | None = None

    @property
    def per_row(self) -> int:
        """The leading rows attended one by one."""
        return self.lens.shape[0] if self.chunks is None or not len(self.chunks) else int(self.chunks[0, 0])


def _bf16(t: torch.Tensor, *shape: int) -> bool:
    return t.dtype == torch.bfloat16 and t.device.type == "cpu" and t.is_contiguous() and t.shape == shape


def _int64(t: torch.Tensor, *shape: int) -> bool:
    return t.dtype == torch.int64 and t.device.type == "cpu" and t.is_contiguous() and t.shape == shape


class FusedStep(StepDescriptor[NativeRows]):
    """The step descriptor (fused_step.py; attention slots `ST_TABLES` .. of cpu_kernels.c) and
    scratch, shared by a model's layers."""

    DTYPE = torch.bfloat16

    def attention_fields(self, cfg: ModelConfig, rows: NativeRows) -> tuple[list[int], list[torch.Tensor]]:
        chunks = rows.chunks if rows.chunks is not None else torch.empty(0, 3, dtype=torch.long)
        # paged_prefill's packed K and V tiles, sized for the longest chunk's sequence
        longest = int(chunks[:, 2].max()) if len(chunks) else 0
        pack = torch.empty(2 * cfg.num_kv_heads * -(-longest // 64) * 64 * cfg.head_dim, dtype=torch.bfloat16)
        fields = [rows.tables.data_ptr(), rows.tables.shape[1], rows.lens.data_ptr(), rows.per_row]
        fields += [chunks.data_ptr(), len(chunks), pack.data_ptr()]
        return fields, [chunks, pack]

    def takes(self, cfg: ModelConfig, rotary: RotaryStep, rows: NativeRows, n: int) -> bool:
        hkv, d = cfg.num_kv_heads, cfg.head_dim
        if not isinstance(rotary, ops.NativeRotaryStep) or not paged_decode_supported(
            rows.k_cache.dtype, cfg.num_heads, hkv, d
        ):
            return False
        k, cos, sin = rows.k_cache, rotary.cos_table, rotary.sin_table
        shapes = n > 0 and k.dim() == 5 and k.shape[3:] == (hkv, d) and cos.dim() == 2 and cos.shape[1] == d
        ok = (
            shapes
            and _bf16(k, *k.shape)
            and _bf16(rows.v_cache, *k.shape)
            and _int64(rows.slot_mapping, n)
            and rows.tables.dim() == 2
            and _int64(rows.tables, n, rows.tables.shape[1])
            and _int64(rotary.positions, n)
            and _int64(rows.lens, n)
            and (rows.chunks is None or _chunks_cover_tail(rows.chunks, n))
            and all(t.dtype == torch.float32 and t.is_contiguous() and t.shape == cos.shape for t in (cos, sin))
        )
        # (lens >= 1: the per-op path's paged_decode raises otherwise; let it)
        return bool(ok and cfg.hidden_size % 16 == 0 and cfg.intermediate_size % 16 == 0 and int(rows.lens.min()) >= 1)


def _chunks_cover_tail(chunks: torch.Tensor, n: int) -> bool:
    """Chunks of >= 1 row each, back to back, ending at row n (what parrot_decoder_layer reads)."""
    if not (chunks.dim() == 2 and _int64(chunks, chunks.shape[0], 3)):
        return False
    end = int(chunks[0, 0]) if len(chunks) else n
    for first, rows, seq_len in chunks.tolist():
        if first != end or rows < 1 or seq_len < rows:
            return False
        end += rows
    return end == n


class FusedDecoderLayer(DecoderLayer):
    """`DecoderLayer` that runs in one native call where it can (see the module docstring)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.fused = True  # False: always the per-op path (set_fused)
        self.step = FusedStep()  # replaced by the model's shared one in `share_steps`
        self.f32 = Float32Layer()  # a float32 model's decode steps (fused_f32.py)
        self.layer_key: tuple[object, ...] | None = None
        self.layer_desc: torch.Tensor | None = None
        self.layer_tensors: list[torch.Tensor] = []  # what layer_desc and norm_ptrs point into, kept alive
        self.norm_ptrs = (0, 0)  # the post-attention and next norms' weights
        self.eps = (0.0, 0.0)

    @classmethod
    def of(cls, layer: DecoderLayer) -> FusedDecoderLayer:
        with torch.device("meta"):  # no memory: the pieces are the replaced layer's
            new = cls(layer.cfg)
        for name, child in layer.named_children():
            setattr(new, name, child)
        return new

    def forward(
        self, idx: int, x: torch.Tensor, h: torch.Tensor, rotary: RotaryStep, attend: AttendFn, next_norm: RMSNorm
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = self._fused(idx, x, h, rotary, attend, next_norm) if self.fused else None
        return super().forward(idx, x, h, rotary, attend, next_norm) if out is None else out

    def _fused(
        self, idx: int, x: torch.Tensor, h: torch.Tensor, rotary: RotaryStep, attend: AttendFn, next_norm: RMSNorm
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The layer in one native call, or None where it does not take this step. (Runs once per
        layer per step: module attributes are read from `_modules` / `_parameters`, not through
        nn.Module.__getattr__, which costs a microsecond each.)"""
        native_rows = getattr(getattr(attend, "__self__", None), "native_rows", None)
        if native_rows is None or torch.is_grad_enabled():
            return None
        rows = native_rows()
        if isinstance(rows, Float32DecodeRows):
            return self.f32.run(self, idx, x, h, rotary, rows, next_norm)
        lib = library.load()
        if lib is None:
            return None
        n, hidden = x.shape[0], self.cfg.hidden_size
        layer = self._layer_desc(n, next_norm) if isinstance(rows, NativeRows) else None
        if layer is None or not (_bf16(x, n, hidden) and _bf16(h, n, hidden)):
            return None
        step = self.step.get(self.cfg, rotary, rows, n)
        if step is None:
            return None
        x_out, h_out = self.step.out_ptrs[idx % 2]
        args = (layer.data_ptr(), step.data_ptr(), idx, x.data_ptr(), h.data_ptr(), self.norm_ptrs[1], x_out, h_out)
        failed = lib.parrot_decoder_layer(*args, *self.eps, rows.scale)
        if failed:
            raise MemoryError(f"fused decoder layer: {failed} attention work items could not allocate their scores")
        out = self.step.outs[idx % 2]
        if idx == self.cfg.num_layers - 1:
            self.step.release()  # the pass is done: its scratch goes now, not at the next step
        return out

    def _layer_desc(self, n: int, next_norm: RMSNorm) -> torch.Tensor | None:
        """The layer's descriptor (`LY_*` of cpu_kernels.c) for a step of n rows, or None where the
        per-op path would not run these kernels; rebuilt when a piece, a weight (or its version) or
        the next norm changes."""
        m = self._modules
        pieces = (m["qkv"], m["o"], m["gate_up"], m["down"], m["post_attn_norm"], m["silu_mul"], next_norm)
        params = [p._parameters.get(name) for p in pieces for name in ("weight", "bias") if p is not None]
        packs = [p.__dict__.get("packed") for p in pieces[:4] if p is not None]
        fingerprint = (
            n <= ops.DOT_MAX_ROWS,
            *pieces,
            *packs,
            *((t.data_ptr(), t._version) for t in params if t is not None),
        )
        if fingerprint != self.layer_key:
            self.layer_key, self.layer_desc = fingerprint, self._build_layer_desc(n, next_norm)
        return self.layer_desc

    def _build_layer_desc(self, n: int, next_norm: RMSNorm) -> torch.Tensor | None:
        linears = [lin for lin in (self.qkv, self.o, self.gate_up, self.down) if isinstance(lin, NativeLinear)]
        invariant = {lin.ROW_INVARIANT for lin in linears}
        if len(linears) < 4:
            return None
        if invariant == {True}:  # ops.linear: the AMX or VNNI kernel over packed weights, at any row count
            packs = [lin.packed.get(lin.weight) for lin in linears]
            layouts = {None if p is None else p.dim() for p in packs}
            if layouts not in ({5}, {4}):
                return None  # (mixed layouts, or a weight on the dot kernel: per op)
            kind = LINEAR_AMX if layouts == {5} else LINEAR_VNNI
        elif invariant == {False} and n <= ops.DOT_MAX_ROWS:  # ops.linear: the dot kernel
            kind, packs = LINEAR_DOT, [lin.weight for lin in linears]
        else:
            return None
        norm, bias, hidden = self.post_attn_norm, self.qkv.bias, self.cfg.hidden_size
        if not isinstance(norm, NativeRMSNorm) or not isinstance(self.silu_mul, NativeSiluMul):
            return None
        if not (isinstance(next_norm, NativeRMSNorm) and _bf16(next_norm.weight, hidden)):
            return None
        weights: list[torch.Tensor] = [p for p in packs if p is not None]
        if len(weights) < 4 or not all(w.dtype == torch.bfloat16 and w.is_contiguous() for w in weights):
            return None  # (a weight the VNNI kernel cannot take runs on the dot kernel per op)
        if bias is not None and not _bf16(bias, bias.shape[0]):
            return None
        ptrs = [t.data_ptr() for t in weights]
        fields = [ptrs[0], 0 if bias is None else bias.data_ptr(), *ptrs[1:], norm.weight.data_ptr(), kind]
        self.layer_tensors = [*weights, norm.weight, next_norm.weight] + ([] if bias is None else [bias])
        self.norm_ptrs = (norm.weight.data_ptr(), next_norm.weight.data_ptr())
        self.eps = (norm.eps, next_norm.eps)
        return torch.tensor(fields, dtype=torch.int64)


def share_steps(model: nn.Module) -> int:
    """Give a model's fused layers one `FusedStep` (the first layer of a step builds it, the others
    reuse it); returns how many layers share it."""
    layers = [m for m in model.modules() if isinstance(m, FusedDecoderLayer)]
    step, step_f32 = FusedStep(), Float32Layer().step
    for layer in layers:
        layer.step, layer.f32.step = step, step_f32
    return len(layers)


def set_fused(model: nn.Module, on: bool) -> int:
    """Turn a model's fused layers on or off (off: the per-op path); returns how many it set."""
    layers = [m for m in model.modules() if isinstance(m, FusedDecoderLayer)]
    for layer in layers:
        layer.fused = on
    return len(layers)
