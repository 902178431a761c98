"""What a benchmark ran on: the commit, the CPU (with the features the engine's dtype and kernels
follow), torch and Python."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from pathlib import Path
from typing import Any


def machine_info() -> dict[str, Any]:
    import torch

    cpu = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    commit = os.environ.get("PARROT_COMMIT")
    if commit is None:
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            git = ["git", "describe", "--always", "--dirty"]
            commit = subprocess.run(git, capture_output=True, text=True, check=True).stdout.strip()
    from parrot.engine.cpu_features import cpu_flags

    return {
        "commit": commit,
        "cpu": cpu,
        # What the engine's dtype and kernels follow (the same model name covers AVX2-only and
        # AVX512-BF16 EPYCs).
        "cpu_features": sorted(cpu_flags() & {"avx2", "avx512f", "avx512_bf16", "amx_bf16"}),
        "num_cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
