"""The batch-invariant transform: `apply_batch_invariant(model)` swaps a loaded model's projections
and LM head, in place, for pieces whose per-row result does not depend on how many rows the step
has (`ops.linear(..., row_invariant=True)`: the VNNI kernel over weights packed by
`ops.pack_vnni` at every row count, or torch one row at a time where no kernel can run).

Why only these: a matmul library picks its kernel (and so its summation order) by the number of
rows: the dot kernel up to 4 rows, AMX up to 128, oneDNN above, each rounding differently. The
model's other pieces already reduce per row in a fixed order (RMSNorm, RoPE, SiLU*up and the
embedding, native or torch), and attention is the backend's business (attention/rowwise.py).
Applied after `apply_native` (it replaces native projections too); applying it twice replaces
nothing more.
"""

from __future__ import annotations

import torch
from torch import nn

from parrot.engine.kernels import ops
from parrot.engine.kernels.transform import PackedWeight
from parrot.engine.model.layers import Linear, LMHead


class RowInvariantLinear(Linear):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.packed = PackedWeight(ops.pack_vnni)

    @classmethod
    def of(cls, linear: Linear) -> RowInvariantLinear:
        with torch.device("meta"):  # no memory: the parameters are the replaced module's
            new = cls(linear.in_features, linear.out_features, bias=linear.bias is not None)
        new.weight, new.bias = linear.weight, linear.bias
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.linear(x, self.weight, self.bias, self.packed.get(self.weight), row_invariant=True)


class RowInvariantLMHead(LMHead):
    def __init__(self, hidden_size: int, vocab_size: int, tied: bool) -> None:
        super().__init__(hidden_size, vocab_size, tied)
        self.packed = PackedWeight(ops.pack_vnni)

    @classmethod
    def of(cls, head: LMHead) -> RowInvariantLMHead:
        with torch.device("meta"):
            new = cls(0, 0, tied=True)
        new.weight = head.weight
        return new

    def forward(self, hidden: torch.Tensor, embed_weight: torch.Tensor) -> torch.Tensor:
        w = self.head_weight(embed_weight)
        return ops.linear(hidden, w, None, self.packed.get(w), row_invariant=True)


def apply_batch_invariant(model: nn.Module) -> int:
    """Swap every projection and the LM head (torch or native) for its row-invariant version;
    returns how many modules were replaced."""
    num_replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, (RowInvariantLinear, RowInvariantLMHead)):
                continue
            new: nn.Module
            if isinstance(child, Linear):
                new = RowInvariantLinear.of(child)
            elif isinstance(child, LMHead):
                new = RowInvariantLMHead.of(child)
            else:
                continue
            new.train(child.training)
            setattr(parent, name, new)
            num_replaced += 1
    return num_replaced
