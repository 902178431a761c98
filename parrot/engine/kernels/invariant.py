"""The batch-invariant transform: `apply_batch_invariant(model)` swaps a loaded model's projections
and LM head, in place, for pieces whose per-row result does not depend on how many rows the step
has (`ops.linear(..., row_invariant=True)`: the AMX kernel where AMX runs, else the VNNI kernel,
over weights packed by `ops.pack_row_invariant` at every row count, or torch one row at a time
where no kernel can run; a float32
model's block pieces take the block kernels at every row count, blocks.py).

Why only these: a matmul library picks its kernel (and so its summation order) by the number of
rows: the dot kernel up to 4 rows, AMX up to 512, oneDNN above, each rounding differently. The
model's other pieces already reduce per row in a fixed order (RMSNorm, RoPE, SiLU*up and the
embedding, native or torch), and attention is the backend's business (attention/rowwise.py).
Applied after `apply_native` (it replaces native projections too); applying it twice replaces
nothing more.
"""

from __future__ import annotations

from torch import nn

from parrot.engine.kernels.blocks import BlockLinear, BlockLMHead, RowInvariantBlockLinear, RowInvariantBlockLMHead
from parrot.engine.kernels.pieces import NativeLinear, NativeLMHead
from parrot.engine.model.layers import Linear, LMHead


class RowInvariantLinear(NativeLinear):
    ROW_INVARIANT = True


class RowInvariantLMHead(NativeLMHead):
    ROW_INVARIANT = True


ROW_INVARIANT_PIECES = (RowInvariantLinear, RowInvariantLMHead, RowInvariantBlockLinear, RowInvariantBlockLMHead)


def apply_batch_invariant(model: nn.Module) -> int:
    """Swap every projection and the LM head (torch or native) for its row-invariant version;
    returns how many modules were replaced."""
    num_replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, ROW_INVARIANT_PIECES):
                continue
            new: nn.Module
            if isinstance(child, BlockLinear):  # float32 over blocks: the block kernels at every row count
                new = RowInvariantBlockLinear.of(child)
            elif isinstance(child, BlockLMHead):
                new = RowInvariantBlockLMHead.of(child)
            elif isinstance(child, Linear):
                new = RowInvariantLinear.of(child)
            elif isinstance(child, LMHead):
                new = RowInvariantLMHead.of(child)
            else:
                continue
            new.train(child.training)
            setattr(parent, name, new)
            num_replaced += 1
    return num_replaced
