"""Where the engine keeps files it builds once and reuses: converted models, the kernel library.

A leaf module (standard library only), so the model loader and the kernels share it without
importing each other.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """`$PARROT_CACHE`, else `~/.cache/parrot` (created on first use)."""
    path = Path(os.environ.get("PARROT_CACHE", Path.home() / ".cache" / "parrot"))
    path.mkdir(parents=True, exist_ok=True)
    return path
