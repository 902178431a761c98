"""The user guide's examples run: every ```python block of docs/user_guide.md, in order, in one
namespace, against a live manager on the tiny engine (PARROT_URL)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from live_server import LiveServer

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "user_guide.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)


def test_the_user_guide_examples_run(server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARROT_URL", server.url)
    blocks = python_blocks(GUIDE.read_text())
    assert len(blocks) == 18
    namespace: dict[str, object] = {"__name__": "user_guide"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"{GUIDE.name}[block {i}]", "exec"), namespace)
    assert namespace["objectives"] == {"c0": "throughput", "c1": "throughput", "c2": "latency"}
