"""Native CPU kernels, built on first use with the system C compiler; torch ops are the fallback.

`linear(x, w, bias, packed)` is `F.linear` for the model's layers in bfloat16:
- at most `DOT_MAX_ROWS` rows (decode of a few sequences, their LM head): an AVX512-BF16 kernel
  that streams each weight row once for all rows (~15 GB/s against ~8 for oneDNN's bf16 gemv);
- up to `AMX_MAX_ROWS` rows, with weights prepacked once by `pack_amx` into AMX tiles: an AMX
  kernel that reads each weight tile once per pass (about 1.5x oneDNN at 32 rows);
- anything else (float32, big prefill chunks, odd shapes): torch.
Both kernels accumulate in fp32, in another order than oneDNN, so roughly one output in 5,000
differs from `F.linear` by one bf16 ulp; turn them off (`EngineConfig.cpu_kernels=False`,
`set_enabled(False)`) for bit-exact comparisons with a torch reference. The switch is per thread:
an engine sets it in its own loop thread, so engines with different settings do not interfere.

The shared library is cached under `<cache_dir>/kernels/`, keyed by the source and flags. It needs
gcc (or $CC) and a CPU with AVX512-BF16 (AMX-BF16 for the AMX path); without them `available()`
is False and everything runs on torch.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import threading
from pathlib import Path

import torch
import torch.nn.functional as F

from parrot.engine.model.rope import apply_rope
from parrot.engine.paths import cache_dir

log = logging.getLogger(__name__)

DOT_MAX_ROWS = 4  # the AVX512 dot kernel up to here, then AMX
AMX_MAX_ROWS = 128  # above this oneDNN's blocking wins (measured: AMX 1.13x at 128 rows, 0.86x at 512)
_SOURCE = Path(__file__).with_name("cpu_kernels.c")
_FLAGS = ["-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mamx-tile", "-mamx-bf16"]
_FLAGS += ["-shared", "-fPIC"]

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False
_amx = False
_switch = threading.local()  # per-thread `enabled` flag (default on)


def _cpu_flags() -> set[str]:
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return set()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def cpu_supports_bf16_dot() -> bool:
    return {"avx512_bf16", "avx512bw", "avx512vl"} <= _cpu_flags()


def _build() -> ctypes.CDLL | None:
    cc = os.environ.get("CC") or shutil.which("gcc")
    if cc is None or not cpu_supports_bf16_dot():
        return None
    key = hashlib.sha256(_SOURCE.read_bytes() + " ".join([cc, *_FLAGS]).encode()).hexdigest()[:16]
    out = cache_dir() / "kernels" / f"cpu_kernels-{key}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        proc = subprocess.run([cc, *_FLAGS, str(_SOURCE), "-o", str(tmp)], capture_output=True, text=True)
        if proc.returncode != 0:
            log.warning("native CPU kernels unavailable, compiling failed: %s", proc.stderr.strip()[-500:])
            return None
        os.replace(tmp, out)  # atomic: concurrent builders never load a half-written file
    lib = ctypes.CDLL(str(out))  # torch is imported first, so its OpenMP runtime is the one used
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    for fn in (lib.parrot_linear_bf16, lib.parrot_linear_amx):
        fn.argtypes = [ptr, i64, ptr, ptr, ptr, i64, i64, i64, ctypes.c_int]
    lib.parrot_linear_bf16.restype = None
    lib.parrot_linear_amx.restype = ctypes.c_int  # -1: out of memory
    lib.parrot_amx_init.restype = ctypes.c_int
    lib.parrot_paged_decode.argtypes = [ptr, i64, ptr, ptr, ptr, i64, ptr, ptr, i64, i64, i64, i64, i64]
    lib.parrot_paged_decode.argtypes += [ctypes.c_float, ctypes.c_int]
    lib.parrot_paged_decode.restype = i64  # work items that could not allocate
    lib.parrot_cascade_decode.argtypes = [ptr, i64, ptr, ptr, i64, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr]
    lib.parrot_cascade_decode.argtypes += [i64, i64, i64, i64, i64, ctypes.c_float, ctypes.c_int]
    lib.parrot_cascade_decode.restype = i64
    lib.parrot_argmax_logsumexp.argtypes = [ptr, i64, i64, ptr, ptr, ctypes.c_int]
    lib.parrot_argmax_logsumexp.restype = None
    lib.parrot_rmsnorm.argtypes = [ptr, ptr, ptr, ptr, ptr, i64, i64, ctypes.c_float, ctypes.c_int]
    lib.parrot_rope.argtypes = [ptr, i64, i64, i64, i64, ptr, ptr, ptr, ctypes.c_int]
    lib.parrot_silu_mul.argtypes = [ptr, ptr, i64, i64, ctypes.c_int]
    for fn in (lib.parrot_rmsnorm, lib.parrot_rope, lib.parrot_silu_mul):
        fn.restype = None
    return lib


def load() -> ctypes.CDLL | None:
    """The kernel library, built once per process (None where it cannot be built)."""
    global _lib, _tried, _amx
    if _tried:  # the hot path (every layer asks): no lock once the build was tried
        return _lib
    with _lock:
        if not _tried:
            _tried = True
            try:
                _lib = _build()
            except OSError as exc:
                log.warning("native CPU kernels unavailable: %s", exc)
                _lib = None
            # AMX needs the CPU feature and the OS's permission for the tile state (per process).
            _amx = _lib is not None and {"amx_bf16", "amx_tile"} <= _cpu_flags() and _lib.parrot_amx_init() == 1
        return _lib


def available() -> bool:
    return load() is not None


def set_enabled(flag: bool) -> bool:
    """Route eligible layers to the native kernels (True, the default) or always to torch.
    Returns the previous setting."""
    previous = _on()
    _switch.enabled = flag
    return previous


def _on() -> bool:
    return bool(getattr(_switch, "enabled", True))


def enabled() -> bool:
    """Native kernels are on for this thread and built (building them on first call)."""
    return _on() and available()


def amx_available() -> bool:
    return load() is not None and _amx


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


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, packed: torch.Tensor | None = None
) -> torch.Tensor:
    """`F.linear(x, weight, bias)`; bf16 steps of up to AMX_MAX_ROWS rows run natively
    (`packed` = `pack_amx(weight)` enables the AMX path for more than DOT_MAX_ROWS rows)."""
    lib = _lib if _on() else None
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
        return F.linear(x, weight, bias)
    m, k = x.shape
    n = weight.shape[0]
    if m <= DOT_MAX_ROWS:
        fn = lib.parrot_linear_bf16
        w = weight
    elif packed is not None and m <= AMX_MAX_ROWS and _amx:
        fn = lib.parrot_linear_amx
        w = packed
    else:
        return F.linear(x, weight, bias)
    if weight.shape[1] != k:
        raise ValueError(f"linear: x has {k} features, weight expects {weight.shape[1]}")
    y = torch.empty(m, n, dtype=torch.bfloat16)
    bias_ptr = None if bias is None else bias.data_ptr()
    if fn(x.data_ptr(), x.stride(0), w.data_ptr(), bias_ptr, y.data_ptr(), m, n, k, torch.get_num_threads()):
        return F.linear(x, weight, bias)  # the AMX kernel could not allocate its padded input
    return y


def argmax_logsumexp(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 logits [B, V] -> (first index of each row's maximum [B] int64, logsumexp [B] fp32),
    one pass per row without a float copy. Callers check `enabled()` first."""
    lib = _lib
    assert lib is not None, "argmax_logsumexp without the native kernels"
    if logits.dtype != torch.bfloat16 or logits.dim() != 2:
        raise ValueError("argmax_logsumexp takes 2-d bfloat16 logits")
    x = logits.contiguous()
    b, v = x.shape
    idx = torch.empty(b, dtype=torch.int64)
    lse = torch.empty(b, dtype=torch.float32)
    lib.parrot_argmax_logsumexp(x.data_ptr(), b, v, idx.data_ptr(), lse.data_ptr(), torch.get_num_threads())
    return idx, lse


# ---- fused elementwise steps of the decoder layer (torch reference when not native) ----------
def _native(*tensors: torch.Tensor) -> ctypes.CDLL | None:
    """The library if every tensor is a contiguous bf16 CPU tensor, kernels are on, no autograd."""
    lib = _lib if _on() else None
    if lib is None or torch.is_grad_enabled():
        return None
    for t in tensors:
        if t.dtype != torch.bfloat16 or t.device.type != "cpu" or not t.is_contiguous():
            return None
    return lib


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # The reference implementation's exact op order (transformers' LlamaRMSNorm).
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, rounding where the reference rounds (fused natively in bf16)."""
    lib = _native(x, weight)
    if lib is None or x.dim() != 2 or x.shape[1] % 16:
        return rms_norm_reference(x, weight, eps)
    out = torch.empty_like(x)
    n, d = x.shape
    lib.parrot_rmsnorm(x.data_ptr(), None, None, weight.data_ptr(), out.data_ptr(), n, d, eps, torch.get_num_threads())
    return out


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(r, rms_norm(r)) with r = x + delta: the residual add and the next norm in one pass."""
    lib = _native(x, delta, weight)
    if lib is None or x.dim() != 2 or x.shape[1] % 16 or x.shape != delta.shape:
        r = x + delta
        return r, rms_norm_reference(r, weight, eps)
    r, out = torch.empty_like(x), torch.empty_like(x)
    n, d = x.shape
    args = (x.data_ptr(), delta.data_ptr(), r.data_ptr(), weight.data_ptr(), out.data_ptr(), n, d, eps)
    lib.parrot_rmsnorm(*args, torch.get_num_threads())
    return r, out


class Rotary:
    """Rotary embedding at one step's `positions` [N], from fp32 tables [max_len, D] (rounded to
    x's dtype first, as the reference does). Built once per forward pass and applied in every
    layer: native in bf16 (in place), else torch ops on tables gathered once for the step."""

    def __init__(self, positions: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor) -> None:
        self.positions, self.cos_table, self.sin_table = positions, cos_table, sin_table
        self._gathered: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, heads, D] (rows may be strided, e.g. a view into the qkv projection)."""
        lib = _native(x[0:0])
        d = x.shape[-1]
        pos = self.positions
        if lib is None or x.dim() != 3 or d % 32 or x.stride(2) != 1 or x.stride(1) != d or pos.dtype != torch.int64:
            if x.dtype not in self._gathered:
                cos = self.cos_table[pos].to(x.dtype).unsqueeze(1)
                self._gathered[x.dtype] = (cos, self.sin_table[pos].to(x.dtype).unsqueeze(1))
            return apply_rope(x, *self._gathered[x.dtype])
        n, h, _ = x.shape
        pos, ct, st = pos.contiguous(), self.cos_table.contiguous(), self.sin_table.contiguous()
        lib.parrot_rope(
            x.data_ptr(), x.stride(0), n, h, d, ct.data_ptr(), st.data_ptr(), pos.data_ptr(), torch.get_num_threads()
        )
        return x


def rope(x: torch.Tensor, positions: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor) -> torch.Tensor:
    """`Rotary(positions, cos_table, sin_table).apply(x)` for a single use."""
    return Rotary(positions, cos_table, sin_table).apply(x)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[N, 2I] = [gate | up] -> silu(gate) * up [N, I]."""
    lib = _native(gate_up)
    n, two_i = gate_up.shape
    if lib is None or gate_up.dim() != 2 or two_i % 32:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up
    out = torch.empty(n, two_i // 2, dtype=gate_up.dtype)
    lib.parrot_silu_mul(gate_up.data_ptr(), out.data_ptr(), n, two_i // 2, torch.get_num_threads())
    return out


# Decode attention over the paged KV cache (per context and shared-prefix): decode.py.
from parrot.engine.kernels.decode import (  # noqa: E402  (it reads this module's library at call time)
    CascadePieces,
    cascade_decode,
    paged_decode,
    paged_decode_on,
    paged_decode_supported,
)

__all__ = [
    "AMX_MAX_ROWS",
    "DOT_MAX_ROWS",
    "CascadePieces",
    "Rotary",
    "add_rms_norm",
    "amx_available",
    "argmax_logsumexp",
    "available",
    "cascade_decode",
    "cpu_supports_bf16_dot",
    "enabled",
    "linear",
    "load",
    "pack_amx",
    "paged_decode",
    "paged_decode_on",
    "paged_decode_supported",
    "rms_norm",
    "rms_norm_reference",
    "rope",
    "set_enabled",
    "silu_mul",
]
