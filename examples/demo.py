"""The demo applications, run one after another against a manager: what `make demo` shows.

run_demo(base_url, document_text) -> list of (name, result, seconds)
"""

from __future__ import annotations

import time
from collections.abc import Callable

from examples.chain_summary import chain_summary
from examples.map_reduce_summary import map_reduce_summary
from examples.multi_output import tell_joke
from examples.native_pipeline import titled


def run_demo(
    base_url: str, document: str, api_key: str = "parrot", print_fn: Callable[[str], None] = print
) -> list[tuple[str, str, float]]:
    apps: list[tuple[str, Callable[[], str]]] = [
        ("chain summary", lambda: chain_summary(document, base_url, api_key)),
        ("map-reduce summary", lambda: map_reduce_summary(document, base_url, api_key)),
        ("multi-output (joke + explanation)", lambda: "\n".join(tell_joke("parrots", base_url, api_key))),
        ("native function in a pipeline", lambda: titled(document, base_url, api_key)),
    ]
    results = []
    for name, app in apps:
        start = time.perf_counter()
        result = app()
        seconds = time.perf_counter() - start
        print_fn(f"== {name} ({seconds:.2f} s end to end)\n{result.strip()}\n")
        results.append((name, result, seconds))
    return results
