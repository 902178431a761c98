"""The native ops of the decoder, each with its torch fallback for inputs it does not take.

`linear(x, w, bias, packed)` is `F.linear` for the model's layers in bfloat16:
- at most `DOT_MAX_ROWS` rows (decode of a few sequences, their LM head): an AVX512-BF16 kernel
  that streams each weight row once for all rows (~15 GB/s against ~8 for oneDNN's bf16 gemv);
- up to `AMX_MAX_ROWS` rows, with weights prepacked once by `pack_amx` into AMX tiles: an AMX
  kernel that reads a panel of rows once per column block (2-3.4 TFLOP/s from 32 rows on two
  cores of an AMX Xeon, 1.6-4x oneDNN's time at 32-128 rows);
- anything else (float32, big prefill chunks, odd shapes, autograd): torch.
With `row_invariant` (the batch-invariant mode), every row count runs one kernel whose per-row sum
walks K in the same order whatever the other rows: the AMX kernel where AMX runs, else the VNNI
kernel, over weights prepacked by `pack_row_invariant` (the dot kernel for weights neither takes),
with `rowwise_linear` as the torch fallback. AMX and VNNI round differently (about one output in
5,000 differs), so one machine runs one of them at every row count.
The kernels accumulate in fp32, in another order than oneDNN, so roughly one output in 5,000
differs from `F.linear` by one bf16 ulp; a model without the native transform is the bit-exact
torch reference. The elementwise steps (RMSNorm with the residual add, RoPE, SiLU*up) round where
the references in parrot.engine.model round; their reductions run in another order. They take
float32 too (block_kernels.c, AVX2: the float32 engine's): RoPE then has the reference's bits,
RMSNorm and SiLU*up differ from torch by float32 rounding (another sum order, another e^x).
Every op runs on torch where its library is unavailable.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch
import torch.nn.functional as F

from parrot.engine.kernels.library import amx_available, blocks_library, load
from parrot.engine.model.layers import add_rms_norm_reference, rms_norm_reference, silu_mul_reference
from parrot.engine.model.rope import RotaryStep

DOT_MAX_ROWS = 4  # the AVX512 dot kernel up to here, then AMX
AMX_MAX_ROWS = 512  # above this oneDNN can win (oneDNN/AMX time: 1.06-1.34x at 512 rows, 0.79-1.07x at 2,048)


def pack_amx(weight: torch.Tensor) -> torch.Tensor | None:
    """`weight` [N, K] in the AMX kernel's tile layout, or None where that kernel cannot take it.

    Tile (n/16, k/32) holds 16 rows of (column, feature pair): element [n][32 kb + 2 r + e] sits at
    [n // 16, kb, r, n % 16, e], the VNNI layout tdpbf16ps reads, 1 KB per tile.
    """
    if not amx_available() or weight.dtype != torch.bfloat16 or weight.dim() != 2:
        return None
    n, k = weight.shape
    if n % 32 or k % 32:
        return None
    return weight.detach().view(n // 16, 16, k // 32, 16, 2).permute(0, 2, 3, 1, 4).contiguous()


def pack_vnni(weight: torch.Tensor) -> torch.Tensor | None:
    """`weight` [N, K] as [N/16, K/2, 16, 2] for parrot_linear_vnni (each feature pair's 16 output
    columns in one 64-byte vector), or None where that kernel cannot take it (N % 16, K % 2)."""
    if weight.dtype != torch.bfloat16 or weight.dim() != 2 or load() is None:
        return None
    n, k = weight.shape
    if n % 16 or k % 2:
        return None
    return weight.detach().view(n // 16, 16, k // 2, 2).permute(0, 2, 1, 3).contiguous()


def pack_row_invariant(weight: torch.Tensor) -> torch.Tensor | None:
    """`weight` packed for the batch-invariant mode's one kernel: AMX tiles where AMX takes it
    (`pack_amx`, 5-d), else the VNNI layout (`pack_vnni`, 4-d), else None (the dot kernel)."""
    packed = pack_amx(weight)
    return packed if packed is not None else pack_vnni(weight)


def rowwise_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear` one row at a time: each row takes torch's one-row path, so its result does not
    depend on the other rows (the batch-invariant fallback where no native kernel runs; slow)."""
    if x.dim() != 2 or x.shape[0] <= 1:
        return F.linear(x, weight, bias)
    return torch.cat([F.linear(x[i : i + 1], weight, bias) for i in range(x.shape[0])])


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    packed: torch.Tensor | None = None,
    row_invariant: bool = False,
) -> torch.Tensor:
    """`F.linear(x, weight, bias)`; bf16 steps of up to AMX_MAX_ROWS rows run natively
    (`packed` = `pack_amx(weight)` enables the AMX path for more than DOT_MAX_ROWS rows).
    `row_invariant`: any number of rows on one kernel, `packed` = `pack_row_invariant(weight)` (AMX
    tiles: the AMX kernel; the VNNI layout: the VNNI kernel; None: the dot kernel), else
    `rowwise_linear`."""
    fallback = rowwise_linear if row_invariant else F.linear
    lib = load()
    if (
        lib is None
        or x.dim() != 2
        or x.dtype != torch.bfloat16
        or weight.dtype != torch.bfloat16
        or x.device.type != "cpu"
        or weight.device.type != "cpu"
        or x.stride(1) != 1
        or not weight.is_contiguous()
        or (bias is not None and (bias.dtype != torch.bfloat16 or not bias.is_contiguous()))
        or torch.is_grad_enabled()
    ):
        return fallback(x, weight, bias)
    m, k = x.shape
    n = weight.shape[0]
    if row_invariant and packed is not None:
        fn = lib.parrot_linear_amx if packed.dim() == 5 else lib.parrot_linear_vnni
        w = packed
    elif m <= DOT_MAX_ROWS or row_invariant:
        fn = lib.parrot_linear_bf16
        w = weight
    elif packed is not None and m <= AMX_MAX_ROWS and amx_available():
        fn = lib.parrot_linear_amx
        w = packed
    else:
        return F.linear(x, weight, bias)
    if weight.shape[1] != k:
        raise ValueError(f"linear: x has {k} features, weight expects {weight.shape[1]}")
    y = torch.empty(m, n, dtype=torch.bfloat16)
    bias_ptr = None if bias is None else bias.data_ptr()
    fn(x.data_ptr(), x.stride(0), w.data_ptr(), bias_ptr, y.data_ptr(), m, n, k, torch.get_num_threads())
    return y


def argmax_logsumexp(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 logits [B, V] -> (first index of each row's maximum [B] int64, logsumexp [B] fp32),
    one pass per row without a float copy. Callers check `available()` first."""
    lib = load()
    assert lib is not None, "argmax_logsumexp without the native kernels"
    if logits.dtype != torch.bfloat16 or logits.dim() != 2:
        raise ValueError("argmax_logsumexp takes 2-d bfloat16 logits")
    x = logits.contiguous()
    b, v = x.shape
    idx = torch.empty(b, dtype=torch.int64)
    lse = torch.empty(b, dtype=torch.float32)
    lib.parrot_argmax_logsumexp(x.data_ptr(), b, v, idx.data_ptr(), lse.data_ptr(), torch.get_num_threads())
    return idx, lse


# ---- fused elementwise steps of the decoder layer (the model's torch reference when not native) ---
def _native(*tensors: torch.Tensor) -> tuple[ctypes.CDLL, str] | None:
    """The library and its functions' suffix when every tensor is a contiguous CPU tensor, all bf16
    (cpu_kernels.c, "") or all float32 (block_kernels.c, "_f32"), and autograd is off; else None."""
    if torch.is_grad_enabled():
        return None
    dtype = tensors[0].dtype
    for t in tensors:
        if t.dtype != dtype or t.device.type != "cpu" or not t.is_contiguous():
            return None
    if dtype == torch.bfloat16:
        lib, suffix = load(), ""
    elif dtype == torch.float32:
        lib, suffix = blocks_library(), "_f32"
    else:
        return None
    return None if lib is None else (lib, suffix)


def _kernel(native: tuple[ctypes.CDLL, str], name: str) -> Any:
    lib, suffix = native
    return getattr(lib, name + suffix)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, rounding where the reference rounds (fused natively in bf16)."""
    native = _native(x, weight)
    if native is None or x.dim() != 2 or x.shape[1] % 16:
        return rms_norm_reference(x, weight, eps)
    out = torch.empty_like(x)
    n, d = x.shape
    args = (x.data_ptr(), None, None, weight.data_ptr(), out.data_ptr(), n, d, eps)
    _kernel(native, "parrot_rmsnorm")(*args, torch.get_num_threads())
    return out


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(r, rms_norm(r)) with r = x + delta: the residual add and the next norm in one pass."""
    native = _native(x, delta, weight)
    if native is None or x.dim() != 2 or x.shape[1] % 16 or x.shape != delta.shape:
        return add_rms_norm_reference(x, delta, weight, eps)
    r, out = torch.empty_like(x), torch.empty_like(x)
    n, d = x.shape
    args = (x.data_ptr(), delta.data_ptr(), r.data_ptr(), weight.data_ptr(), out.data_ptr(), n, d, eps)
    _kernel(native, "parrot_rmsnorm")(*args, torch.get_num_threads())
    return r, out


class NativeRotaryStep(RotaryStep):
    """`RotaryStep` that rotates bf16 or float32 heads in place natively (the torch gather otherwise)."""

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, heads, D] (rows may be strided, e.g. a view into the qkv projection)."""
        native = _native(x[0:0])
        d = x.shape[-1]
        pos = self.positions
        if native is None or x.dim() != 3 or d % 32 or x.stride(2) != 1 or x.stride(1) != d or pos.dtype != torch.int64:
            return super().apply(x)
        n, h, _ = x.shape
        pos, ct, st = pos.contiguous(), self.cos_table.contiguous(), self.sin_table.contiguous()
        _kernel(native, "parrot_rope")(
            x.data_ptr(), x.stride(0), n, h, d, ct.data_ptr(), st.data_ptr(), pos.data_ptr(), torch.get_num_threads()
        )
        return x


def rope(x: torch.Tensor, positions: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor) -> torch.Tensor:
    """`NativeRotaryStep(positions, cos_table, sin_table).apply(x)` for a single use."""
    return NativeRotaryStep(positions, cos_table, sin_table).apply(x)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[N, 2I] = [gate | up] -> silu(gate) * up [N, I]."""
    native = _native(gate_up)
    n, two_i = gate_up.shape
    if native is None or gate_up.dim() != 2 or two_i % 32:
        return silu_mul_reference(gate_up)
    out = torch.empty(n, two_i // 2, dtype=gate_up.dtype)
    _kernel(native, "parrot_silu_mul")(gate_up.data_ptr(), out.data_ptr(), n, two_i // 2, torch.get_num_threads())
    return out
