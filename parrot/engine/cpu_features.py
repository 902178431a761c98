"""What the CPU can do, read once from /proc/cpuinfo (no torch): the engine picks its dtype and
its native kernels by these flags."""

from __future__ import annotations

import functools
import platform
from pathlib import Path

BF16_DOT_FLAGS = frozenset({"avx512_bf16", "avx512bw", "avx512vl"})  # the native kernels' instructions
AMX_FLAGS = frozenset({"amx_bf16", "amx_tile"})


def x86_linux() -> bool:
    return platform.system() == "Linux" and platform.machine() in ("x86_64", "AMD64")


@functools.cache
def cpu_flags() -> frozenset[str]:
    if not x86_linux():
        return frozenset()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return frozenset(line.split(":", 1)[-1].split())


def cpu_computes_bf16() -> bool:
    """The CPU has bfloat16 arithmetic (AVX512-BF16 or AMX): bf16 models run fast on it."""
    flags = cpu_flags()
    return "avx512_bf16" in flags or not AMX_FLAGS - flags
