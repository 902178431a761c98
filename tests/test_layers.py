"""Imports go one way: protocol at the bottom; frontend and serve never import torch or the engine;
the engine never imports serve or frontend."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "parrot"

FORBIDDEN = {
    "protocol": ("parrot.", "torch"),
    "text": ("parrot.engine", "parrot.serve", "parrot.frontend", "torch"),
    "frontend": ("parrot.engine", "parrot.serve", "parrot.text", "torch", "transformers"),
    "serve": ("parrot.engine", "parrot.frontend", "torch", "transformers"),
    "engine": ("parrot.serve", "parrot.frontend"),
}
ALLOWED = {"protocol": ("parrot.protocol",)}


def imports_of(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_go_one_way(layer: str) -> None:
    files = sorted((ROOT / layer).rglob("*.py"))
    assert files, f"no files in parrot/{layer}"
    bad = []
    for f in files:
        for name in imports_of(f):
            allowed = any(name.startswith(a) for a in ALLOWED.get(layer, ()))
            if not allowed and any(name == p.rstrip(".") or name.startswith(p) for p in FORBIDDEN[layer]):
                bad.append(f"{f.relative_to(ROOT)} imports {name}")
    assert bad == []
