"""The README's quickstart examples run: each ```python block of README.md, in order, against a live
manager on the tiny engine (the examples' `http://127.0.0.1:8000` becomes the test server's URL)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from live_server import LiveServer

README = Path(__file__).resolve().parents[2] / "README.md"
EXAMPLE_URL = "http://127.0.0.1:8000"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)


def test_the_readme_quickstart_examples_run(server: LiveServer, capsys: pytest.CaptureFixture[str]) -> None:
    blocks = python_blocks(README.read_text())
    assert len(blocks) == 3  # the SDK, the openai package, LangChain
    for i, block in enumerate(blocks):
        assert EXAMPLE_URL in block, f"block {i} does not talk to the quickstart's server"
        code = block.replace(EXAMPLE_URL, server.url)
        exec(compile(code, f"README.md[block {i}]", "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    # The SDK example's status lines: the two summaries ran for throughput, the memo for latency,
    # and the second summary reused the report's prefix that the first computed.
    lines = [line for line in out.splitlines() if line.startswith(("summarize ", "combine "))]
    assert [line.split()[:2] for line in lines] == [
        ["summarize", "throughput"],
        ["summarize", "throughput"],
        ["combine", "latency"],
    ]
    reused = [int(line.split("reused ")[1].split()[0]) for line in lines]
    assert reused[0] == 0 and reused[1] > 0
