"""Shared bits of the examples: document chunking, a small CLI."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path


def chunk_words(text: str, chunk_len: int = 250) -> list[str]:
    """The document as consecutive chunks of `chunk_len` words (the last may be shorter)."""
    words = text.split()
    if not words:
        raise ValueError("the document is empty")
    return [" ".join(words[i : i + chunk_len]) for i in range(0, len(words), chunk_len)]


def cli(description: str, run: Callable[[str, str, str | None], str]) -> None:
    """`python -m examples.<name> --url URL --file DOC`: run the app, print its result and time."""
    parser = argparse.ArgumentParser(description=description)
    # `parrot run examples/<name>.py` passes the manager in PARROT_URL / PARROT_API_KEY.
    parser.add_argument("--url", default=os.environ.get("PARROT_URL", "http://127.0.0.1:8000"), help="the manager")
    parser.add_argument("--api-key", default=os.environ.get("PARROT_API_KEY"), help="none: a development manager")
    parser.add_argument("--file", type=Path, help="a text document (default: a short built-in text)")
    args = parser.parse_args()
    text = args.file.read_text() if args.file else SAMPLE_TEXT
    start = time.perf_counter()
    result = run(text, args.url, args.api_key)
    print(result)
    print(f"[end to end: {time.perf_counter() - start:.2f} s]")


SAMPLE_TEXT = (
    "Parrot serves applications built from many LLM calls. Each call is a prompt template whose "
    "inputs and outputs are Semantic Variables. Because the service sees how calls connect, it runs "
    "a consumer as soon as its producer finishes, shares prompt prefixes, and schedules whole "
    "applications rather than single requests."
)
