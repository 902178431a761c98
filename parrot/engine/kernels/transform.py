"""The native transform: `apply_native(model)` swaps a loaded model's pieces, in place, for
subclasses that run the native CPU kernels (gpt-fast style: a speed-up applied to a finished
model, not a flag threaded through it).

Swapped: every `Linear`, `RMSNorm`, `SiluMul`, `Rotary` and the `LMHead` for its native piece
(pieces.py), and every `DecoderLayer` for a `FusedDecoderLayer` (fused.py: the whole layer in one
native call where the step's attention and pieces allow, the per-op path otherwise). Each shares
its parameters with the piece it replaced (nothing is copied; loading still works). A float32
model takes `apply_elementwise` instead (its RMSNorm, SiLU*up and rotary on the AVX2 kernels;
its linears are blocks.py's `apply_blocks`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from parrot.engine.kernels import library
from parrot.engine.kernels.fused import FusedDecoderLayer, share_steps
from parrot.engine.kernels.pieces import NativeLinear, NativeLMHead, NativeRMSNorm, NativeRotary, NativeSiluMul
from parrot.engine.model.layers import Linear, LMHead, RMSNorm, SiluMul
from parrot.engine.model.llama import DecoderLayer
from parrot.engine.model.rope import Rotary

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
