"""The native kernel libraries: each built once per process from its C file with the system C
compiler, loaded through ctypes, and why it is unavailable when it is.

- cpu_kernels.c, the bf16 decoder's kernels: needs a CPU with AVX512-BF16; its AMX path also needs
  AMX-BF16 and the OS's permission for the tile state. `status()` names what runs
  ("avx512_bf16+amx", "avx512_bf16") or says why nothing does ("unavailable: <reason>").
- block_kernels.c, the float32 engine's kernels: linears over GGUF block-encoded weights
  (blocks.py), decode and prefill attention over a float32 paged KV cache (decode.py) and the decoder's
  elementwise steps (RMSNorm, RoPE, SiLU*up: ops.py): needs AVX2 + FMA
  (`blocks_library()`, `blocks_status()`).
Both include the C code they share from csrc/ (the vector operations per instruction set, e^x,
the elementwise steps, the cascade's driver and merge, the decoder layer's sequence: see
README.md). A library is cached under `<cache_dir>/kernels/`, keyed by its source, the shared
headers, the compiler and the flags, and needs gcc (or $CC). The engine logs what runs once at
start (transform.py) and reports it in stats.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from parrot.engine.cpu_features import AMX_FLAGS, BF16_DOT_FLAGS, cpu_flags, x86_linux
from parrot.engine.paths import cache_dir

SOURCE = Path(__file__).with_name("cpu_kernels.c")
SHARED = Path(__file__).with_name("csrc")  # the headers both C files include
_FLAGS = ["-O3", "-fopenmp", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mamx-tile", "-mamx-bf16"]
# No contraction of a * b + c into FMAs: gcc chose per inlined copy, so the decode and prefill
# kernels' shared softmax summed one row's weights with and without an FMA (an fp32 ulp, about one
# output in 5,000 a bf16 ulp apart: seen on a Xeon). The kernels' FMAs are written as intrinsics.
_FLAGS += ["-ffp-contract=off", "-shared", "-fPIC"]

_I64, _PTR, _F32, _INT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_int
# name -> (restype, argtypes): the ctypes view of every function cpu_kernels.c exports, in one table
# (tests/engine/test_kernel_signatures.py parses the C signatures and checks them against it).
SIGNATURES: dict[str, tuple[type | None, list[type]]] = {
    "parrot_linear_bf16": (None, [_PTR, _I64, _PTR, _PTR, _PTR, _I64, _I64, _I64, _INT]),
    "parrot_linear_amx": (None, [_PTR, _I64, _PTR, _PTR, _PTR, _I64, _I64, _I64, _INT]),
    "parrot_linear_vnni": (None, [_PTR, _I64, _PTR, _PTR, _PTR, _I64, _I64, _I64, _INT]),
    "parrot_amx_init": (_INT, []),  # 1: the OS granted the AMX tile state
    "parrot_attention_amx": (_INT, [_INT]),  # 1, 0: attention on AMX or not; -1: only ask
    # Decode attention: the number of work items that could not allocate (0 on success).
    "parrot_paged_decode": (_I64, [_PTR, _I64, _PTR, _PTR, _PTR, _I64, _PTR, _PTR, *[_I64] * 5, _F32, _INT]),
    "parrot_cascade_decode": (_I64, [_PTR, _I64, _PTR, _PTR, _I64, *[_PTR] * 8, *[_I64] * 5, _F32, _INT]),
    # Causal prefill attention of one chunk: the number of work items that could not allocate.
    "parrot_paged_prefill": (_I64, [_PTR, _I64, _PTR, _PTR, _PTR, _I64, _I64, *[_PTR] * 3, *[_I64] * 4, _F32, _INT]),
    "parrot_argmax_logsumexp": (None, [_PTR, _I64, _I64, _PTR, _PTR, _INT]),
    "parrot_rmsnorm": (None, [_PTR, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _F32, _INT]),
    "parrot_rope": (None, [_PTR, _I64, _I64, _I64, _I64, _PTR, _PTR, _PTR, _INT]),
    "parrot_silu_mul": (None, [_PTR, _PTR, _I64, _I64, _INT]),
    # One decoder layer (fused.py): the number of attention work items that could not allocate.
    "parrot_decoder_layer": (_I64, [_PTR, _PTR, _I64, *[_PTR] * 5, _F32, _F32, _F32]),
}
BLOCKS_SOURCE = Path(__file__).with_name("block_kernels.c")
BLOCKS_FLAGS = ["-O3", "-fopenmp", "-mavx2", "-mfma", "-ffp-contract=off", "-shared", "-fPIC"]
BLOCKS_CPU_FLAGS = frozenset({"avx2", "fma"})
BLOCKS_SIGNATURES: dict[str, tuple[type | None, list[type]]] = {
    "parrot_linear_q4_1": (None, [_PTR, _I64, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _INT]),
    "parrot_linear_q8_0": (None, [_PTR, _I64, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _I64, _INT]),
    # float32 decode attention (per context and cascade): the work items that could not allocate.
    "parrot_cascade_decode_f32": SIGNATURES["parrot_cascade_decode"],
    # float32 causal prefill attention of one chunk, with the bf16 kernel's arguments.
    "parrot_paged_prefill_f32": SIGNATURES["parrot_paged_prefill"],
    # The float32 decoder's elementwise steps (ops.py), with the bf16 ones' arguments.
    "parrot_rmsnorm_f32": SIGNATURES["parrot_rmsnorm"],
    "parrot_rope_f32": SIGNATURES["parrot_rope"],
    "parrot_silu_mul_f32": SIGNATURES["parrot_silu_mul"],
    # One float32 decoder layer of a decode step (fused_f32.py), with the bf16 one's arguments.
    "parrot_decoder_layer_f32": SIGNATURES["parrot_decoder_layer"],
}


@dataclass(frozen=True)
class Source:
    """A C file, its compiler flags, the CPU flags its instructions need and its ctypes table."""

    path: Path
    flags: tuple[str, ...]
    needs: frozenset[str]
    signatures: dict[str, tuple[type | None, list[type]]] = field(hash=False)

    def text(self) -> bytes:
        """The C file and every shared header it may include: what its build is keyed by."""
        return b"".join(p.read_bytes() for p in [self.path, *sorted(SHARED.glob("*.h"))])


KERNELS = Source(SOURCE, tuple(_FLAGS), BF16_DOT_FLAGS, SIGNATURES)
BLOCKS = Source(BLOCKS_SOURCE, tuple(BLOCKS_FLAGS), BLOCKS_CPU_FLAGS, BLOCKS_SIGNATURES)


def build(source: Source) -> tuple[ctypes.CDLL | None, str]:
    """(the library, "") or (None, why not)."""
    if not x86_linux():
        return None, f"not an x86-64 Linux machine ({platform.system()} {platform.machine()})"
    missing = source.needs - cpu_flags()
    if missing:
        return None, f"the CPU lacks {', '.join(sorted(missing))}"
    cc = os.environ.get("CC") or shutil.which("gcc")
    if cc is None:
        return None, "no C compiler (gcc is not on PATH and $CC is unset)"
    key = hashlib.sha256(source.text() + " ".join([cc, *source.flags]).encode()).hexdigest()[:16]
    out = cache_dir() / "kernels" / f"{source.path.stem}-{key}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        proc = subprocess.run([cc, *source.flags, str(source.path), "-o", str(tmp)], capture_output=True, text=True)
        if proc.returncode != 0:
            return None, f"compiling {source.path.name} with {cc} failed: {proc.stderr.strip()[-500:]}"
        os.replace(tmp, out)  # atomic: concurrent builders never load a half-written file
    lib = ctypes.CDLL(str(out))  # torch is imported first, so its OpenMP runtime is the one used
    for name, (restype, argtypes) in source.signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib, ""


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False
_amx = False
_reason = ""  # why the library is unavailable, or (with it) why AMX is not used
_blocks: tuple[ctypes.CDLL | None, str] | None = None  # the block kernels once built: (library, why not)


def cpu_supports_bf16_dot() -> bool:
    return not BF16_DOT_FLAGS - cpu_flags()


def blocks_library() -> ctypes.CDLL | None:
    """The block-weight kernels (block_kernels.c), built once per process; None where they cannot be."""
    global _blocks
    if _blocks is None:
        with _lock:
            if _blocks is None:
                try:
                    _blocks = build(BLOCKS)
                except OSError as exc:
                    _blocks = (None, f"building or loading the library failed: {exc}")
    return _blocks[0]


def blocks_status() -> str:
    """ "avx2_fma" or "unavailable: <reason>" (building on first call)."""
    lib = blocks_library()
    assert _blocks is not None
    return "avx2_fma" if lib is not None else f"unavailable: {_blocks[1]}"


def load() -> ctypes.CDLL | None:
    """The kernel library, built once per process (None where it cannot be built: see `status`)."""
    global _lib, _tried, _amx, _reason
    if _tried:  # the hot path (every native op asks): no lock once the build was tried
        return _lib
    with _lock:
        if not _tried:
            try:
                _lib, _reason = build(KERNELS)
            except OSError as exc:
                _lib, _reason = None, f"building or loading the library failed: {exc}"
            if _lib is not None:
                # AMX needs the CPU feature and the OS's permission for the tile state (per process).
                missing = AMX_FLAGS - cpu_flags()
                if missing:
                    _reason = f"no AMX: the CPU lacks {', '.join(sorted(missing))}"
                elif _lib.parrot_amx_init() != 1:
                    _reason = "no AMX: the OS refused the AMX tile state"
                else:
                    _amx = True
            _tried = True
        return _lib


def available() -> bool:
    return load() is not None


def amx_available() -> bool:
    return load() is not None and _amx


def status() -> str:
    """ "avx512_bf16+amx", "avx512_bf16", or "unavailable: <reason>" (building on first call)."""
    if load() is None:
        return f"unavailable: {_reason}"
    return "avx512_bf16+amx" if _amx else "avx512_bf16"


def note() -> str:
    """Why the library is unavailable, or with it why AMX is not used; "" when all of it runs."""
    load()
    return _reason
