"""The engine's dtype follows the CPU: bfloat16 only where the CPU computes it (on an AVX2-only
CPU torch's bf16 matmul runs ~60x slower than float32)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from parrot.engine import cpu_features
from parrot.engine.config import EngineConfig, resolve_dtype


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"avx2", "fma"}, "float32"),  # AMD EPYC Zen 3: AVX2 only
        ({"avx2", "avx512f", "avx512bw", "avx512vl"}, "float32"),  # AVX-512 without BF16
        ({"avx2", "avx512bw", "avx512vl", "avx512_bf16"}, "bfloat16"),  # AMD Zen 4, Intel Cooper Lake
        ({"avx2", "amx_bf16", "amx_tile"}, "bfloat16"),  # Intel Sapphire Rapids
    ],
)
def test_auto_dtype_follows_the_cpus_bf16_arithmetic(
    monkeypatch: pytest.MonkeyPatch, flags: set[str], expected: str
) -> None:
    monkeypatch.setattr(cpu_features, "cpu_flags", lambda: frozenset(flags))
    assert resolve_dtype("auto") == expected
    assert EngineConfig(dtype="auto").dtype == expected  # the config holds the resolved name
    assert EngineConfig().dtype == expected  # auto is the default
    assert EngineConfig(dtype="bfloat16").dtype == "bfloat16"  # an explicit choice stands
    assert EngineConfig(dtype="float32").dtype == "float32"


def test_an_unknown_dtype_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="dtype must be one of auto, bfloat16, float32, got 'float16'"):
        EngineConfig(dtype="float16")


def test_config_does_not_import_torch() -> None:
    # The manager and the CLI read engine configs; reading the CPU's flags must not pull torch in.
    code = "import sys, parrot.engine.config as c; c.EngineConfig(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
