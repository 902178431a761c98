"""The native pieces of the model: subclasses of its torch pieces (model/layers.py, model/rope.py)
that run the native CPU kernels, swapped in by `transform.apply_native`.

`NativeLinear` (AVX512 dot kernel for a few rows, AMX over prepacked weights up to AMX_MAX_ROWS;
in the batch-invariant mode AMX, else VNNI, at every row count),
`NativeRMSNorm` (fused with the residual add), `NativeSiluMul`, `NativeRotary` (in place) and
`NativeLMHead`. Each keeps its torch parent's path for inputs the kernels do not take, and shares
its parameters with the piece it replaced (nothing is copied; loading still works).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, Self, TypeVar

import torch

from parrot.engine.kernels import ops
from parrot.engine.model.layers import Linear, LMHead, RMSNorm, SiluMul
from parrot.engine.model.rope import Rotary, RotaryStep

P = TypeVar("P")


class PackedWeight(Generic[P]):
    """A weight's packed form (`pack`: the AMX tiles or VNNI layout; blocks.py: its block encoding),
    made again when the weight changes (in-place writes such as `copy_` in loading bump its
    version; writes through `.data` do not and need a new PackedWeight); None for a weight of
    another dtype than `dtype`, or one `pack` cannot take. The AMX tiles double the memory of the
    bf16 linear weights."""

    def __init__(self, pack: Callable[[torch.Tensor], P | None], dtype: torch.dtype = torch.bfloat16) -> None:
        self.pack = pack
        self.dtype = dtype
        self.key: tuple[int, int] | None = None
        self.packed: P | None = None

    def get(self, weight: torch.Tensor) -> P | None:
        if weight.dtype != self.dtype:
            return None  # nothing cached: a later weight of the dtype still packs
        key = (weight.data_ptr(), weight._version)
        if key != self.key:
            self.key, self.packed = key, self.pack(weight)
        return self.packed


L = TypeVar("L", bound=Linear)
H = TypeVar("H", bound=LMHead)


def linear_sharing(cls: type[L], linear: Linear) -> L:
    """A `cls` module over `linear`'s own parameters (made on the meta device: no memory)."""
    with torch.device("meta"):
        new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None)
    new.weight, new.bias = linear.weight, linear.bias
    return new


def head_sharing(cls: type[H], head: LMHead) -> H:
    """A `cls` LM head over `head`'s own weight (made on the meta device: no memory)."""
    with torch.device("meta"):
        new = cls(0, 0, tied=True)
    new.weight = head.weight
    return new


class NativeLinear(Linear):
    """A projection on the native kernels; subclasses pick another packing and kernel family."""

    ROW_INVARIANT = False  # True: one per-row summation order at every row count (invariant.py)

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.packed = PackedWeight(ops.pack_row_invariant if self.ROW_INVARIANT else ops.pack_amx)

    @classmethod
    def of(cls, linear: Linear) -> Self:
        return linear_sharing(cls, linear)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        packed = self.packed.get(self.weight)
        return ops.linear(x, self.weight, self.bias, packed, row_invariant=self.ROW_INVARIANT)


class NativeRMSNorm(RMSNorm):
    @classmethod
    def of(cls, norm: RMSNorm) -> NativeRMSNorm:
        with torch.device("meta"):
            new = cls(norm.weight.shape[0], norm.eps)
        new.weight = norm.weight
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.rms_norm(x, self.weight, self.eps)

    def add_and_norm(self, x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return ops.add_rms_norm(x, delta, self.weight, self.eps)


class NativeSiluMul(SiluMul):
    @classmethod
    def of(cls, _: SiluMul) -> NativeSiluMul:
        return cls()

    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        return ops.silu_mul(gate_up)


class NativeRotary(Rotary):
    @classmethod
    def of(cls, rotary: Rotary) -> NativeRotary:
        return cls(rotary.cos, rotary.sin)

    def at(self, positions: torch.Tensor) -> RotaryStep:
        return ops.NativeRotaryStep(positions, self.cos, self.sin)


class NativeLMHead(LMHead):
    ROW_INVARIANT = False  # as NativeLinear's

    def __init__(self, hidden_size: int, vocab_size: int, tied: bool) -> None:
        super().__init__(hidden_size, vocab_size, tied)
        self.packed = PackedWeight(ops.pack_row_invariant if self.ROW_INVARIANT else ops.pack_amx)

    @classmethod
    def of(cls, head: LMHead) -> Self:
        return head_sharing(cls, head)

    def forward(self, hidden: torch.Tensor, embed_weight: torch.Tensor) -> torch.Tensor:
        w = self.head_weight(embed_weight)
        return ops.linear(hidden, w, None, self.packed.get(w), row_invariant=self.ROW_INVARIANT)
