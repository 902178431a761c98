"""The native transform: `apply_native(model)` swaps a loaded model's pieces, in place, for
subclasses that run the native CPU kernels (gpt-fast style: a speed-up applied to a finished
model, not a flag threaded through it).

Swapped: every `Linear`, `RMSNorm`, `SiluMul`, `Rotary` and the `LMHead` for its native piece
(pieces.py), and every `DecoderLayer` for a `FusedDecoderLayer` (fused.py: the whole layer in one
native call where the step's attention and pieces allow, the per-op path otherwise). Each shares
its parameters with the piece it replaced (nothing is copied; loading still works). A float32
model takes `apply_elementwise` instead (its RMSNorm, SiLU*up and rotary on the AVX2 kernels;
its linears are blocks.py's `apply_blocks`).

An engine applies them through `apply_engine_kernels`, once per engine start, which logs one line
at info level on the "parrot.engine.kernels" logger naming what runs, e.g.
"native kernels: avx512_bf16 (linears, attention, elementwise, sampler, fused layers: 243 modules;
no AMX: the CPU lacks amx_bf16, amx_tile); block kernels: off (bfloat16 model)".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

from parrot.engine.kernels import library
from parrot.engine.kernels.blocks import apply_blocks
from parrot.engine.kernels.decode import paged_decode_supported
from parrot.engine.kernels.fused import FusedDecoderLayer, share_steps
from parrot.engine.kernels.pieces import NativeLinear, NativeLMHead, NativeRMSNorm, NativeRotary, NativeSiluMul
from parrot.engine.model.config import ModelConfig
from parrot.engine.model.layers import Linear, LMHead, RMSNorm, SiluMul
from parrot.engine.model.llama import DecoderLayer
from parrot.engine.model.rope import Rotary

log = logging.getLogger("parrot.engine.kernels")

# torch piece -> its native replacement (exact types: a piece already native is left alone).
NATIVE_PIECES: dict[type[nn.Module], type] = {
    Linear: NativeLinear,
    RMSNorm: NativeRMSNorm,
    SiluMul: NativeSiluMul,
    Rotary: NativeRotary,
    LMHead: NativeLMHead,
    DecoderLayer: FusedDecoderLayer,
}
# The pieces whose native versions also take float32 (block_kernels.c, AVX2): `apply_elementwise`.
# Its decoder layers too: a fused layer runs a float32 decode step in one call (fused_f32.py).
ELEMENTWISE_PIECES: dict[type[nn.Module], type] = {
    t: NATIVE_PIECES[t] for t in (RMSNorm, SiluMul, Rotary, DecoderLayer)
}


@dataclass(frozen=True)
class NativeReport:
    """What `apply_native` did. `status` is what EngineStats.native_kernels reports."""

    status: str  # "avx512_bf16+amx", "avx512_bf16", or "unavailable: <reason>"
    num_replaced: int = 0  # modules swapped for native ones
    note: str = ""  # why AMX is not used (when the library runs without it)

    @property
    def applied(self) -> bool:
        return not self.status.startswith("unavailable")


def apply_native(model: nn.Module) -> NativeReport:
    """Swap the model's pieces for native ones, in place, once the kernel library is built; leave
    the model untouched (and say why) where the library is unavailable or the weights are not
    bfloat16. Applying it twice replaces nothing more."""
    dtypes = {p.dtype for p in model.parameters()}
    if dtypes != {torch.bfloat16}:
        names = ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
        return NativeReport(f"unavailable: the kernels take bfloat16 weights and the model's are {names}")
    if not library.available():
        return NativeReport(library.status())
    num_replaced = _swap(model, NATIVE_PIECES)
    share_steps(model)
    return NativeReport(library.status(), num_replaced, library.note())


def apply_elementwise(model: nn.Module) -> int:
    """Swap a float32 model's RMSNorms, SiLU*up and rotary for their native pieces and its decoder
    layers for fused ones, in place, where the AVX2 library is built (their float32 kernels);
    returns how many were swapped (0: none)."""
    if {p.dtype for p in model.parameters()} != {torch.float32} or library.blocks_library() is None:
        return 0
    num_replaced = _swap(model, ELEMENTWISE_PIECES)
    share_steps(model)
    return num_replaced


@dataclass(frozen=True)
class EngineKernels:
    """What `apply_engine_kernels` applied to an engine's model."""

    native: bool  # the bf16 kernels run the model (its backend and sampler use them too)
    status: str  # what EngineStats.native_kernels reports: the bf16 kernels', or the block kernels' when they run
    line: str  # what runs, as logged


def apply_engine_kernels(model: nn.Module, cfg: ModelConfig, enabled: bool) -> EngineKernels:
    """Apply the native kernels an engine's model takes (`apply_native`; a float32 model:
    `apply_blocks` and `apply_elementwise`; nothing where `enabled` is False) and log one line
    naming what runs. Call once per engine start."""
    if not enabled:
        off = "off (EngineConfig.cpu_kernels=False)"
        return _chosen(False, "off", off, off)
    dtypes = {p.dtype for p in model.parameters()}
    names = ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
    report = apply_native(model)
    if report.applied:
        parts = ["linears", _attention(torch.bfloat16, cfg), "elementwise", "sampler", "fused layers"]
        note = f"; {report.note}" if report.note else ""
        native = f"{report.status} ({', '.join(parts)}: {report.num_replaced} modules{note})"
        return _chosen(True, report.status, native, f"off ({names} model)")
    if dtypes != {torch.float32}:
        return _chosen(False, report.status, report.status, f"off ({names} model)")
    blocks = apply_blocks(model)  # a float32 GGUF model's linears over its blocks
    num_elementwise = apply_elementwise(model)  # its RMSNorm, SiLU*up, rotary and fused layers (AVX2)
    status = blocks.status if blocks.applied else report.status
    native = f"off ({names} model)"
    if not num_elementwise:  # the block library did not build
        return _chosen(False, status, native, library.blocks_status())
    blocks_status = library.blocks_status()
    if blocks.applied:
        linears = f"linears over GGUF {blocks.status.removeprefix(blocks_status + ' ')}"
    else:
        linears = f"linears on torch ({blocks.status})"
    parts = [linears, _attention(torch.float32, cfg), f"elementwise and fused layers: {num_elementwise} modules"]
    return _chosen(False, status, native, f"{blocks_status} ({'; '.join(parts)})")


def _attention(dtype: torch.dtype, cfg: ModelConfig) -> str:
    if paged_decode_supported(dtype, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim):
        return "attention"
    return f"attention on torch (no kernel for {cfg.num_heads} / {cfg.num_kv_heads} heads of {cfg.head_dim})"


def _chosen(native: bool, status: str, native_line: str, blocks_line: str) -> EngineKernels:
    line = f"native kernels: {native_line}; block kernels: {blocks_line}"
    log.info("%s", line)
    return EngineKernels(native, status, line)


def _swap(model: nn.Module, table: dict[type[nn.Module], type]) -> int:
    """Swap every child whose exact type `table` names; children before their parents (reversed
    pre-order), so a fused layer is made from the native pieces."""
    num_replaced = 0
    for parent in reversed(list(model.modules())):
        for name, child in list(parent.named_children()):
            native = table.get(type(child))
            if native is not None:
                new = native.of(child)  # type: ignore[attr-defined]
                new.train(child.training)
                setattr(parent, name, new)
                num_replaced += 1
    return num_replaced
