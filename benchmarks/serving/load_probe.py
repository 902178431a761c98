"""Plain load, as an outside tester would send it: many sessions, each a chain of dependent calls,
all at once over HTTP, against the manager and a builtin engine on loopback.

    python -m benchmarks.serving.load_probe     # tiny random model, 200 sessions x 3 calls
    python -m benchmarks.serving.load_probe --sessions 50 --model smollm2-135m

Prints calls completed of those sent, session latency percentiles (p50 / p95 / p99 / max, from the
first submit to the chain's last value), errors by status, and whether the engine's free KV blocks
came back to where they started once the sessions were deleted.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import statistics
import time

from benchmarks.serving.tenant_flood import engine_config
from parrot.backends.connect import connect_engine
from parrot.engine.async_engine import AsyncEngine
from parrot.frontend import AsyncSession, Input, Output, semantic_function
from parrot.protocol.errors import ParrotError
from parrot.serve import ManagerConfig, create_app, create_manager
from parrot.serve.config import SharingConfig
from parrot.web.server_thread import ServerThread


@semantic_function()
def step(text: Input, out: Output = Output(max_tokens=8, ignore_eos=True)):  # type: ignore[no-untyped-def]  # noqa: B008
    """Rewrite this more briefly: {{input:text}}
    Shorter: {{output:out}}"""


async def one_chain(url: str, i: int, num_calls: int, errors: collections.Counter[str]) -> float | None:
    """Seconds from the first submit to the chain's last value; None if it failed."""
    start = time.monotonic()
    try:
        async with AsyncSession(url, api_key="load") as session:
            value = session.variable(value=f"Session {i} starts with a short story about a fox.")
            for _ in range(num_calls):
                value = step(value)
            await value.aget(timeout=600)
    except ParrotError as e:
        errors[str(e.status)] += 1
        return None
    return time.monotonic() - start


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def probe(url: str, num_sessions: int, num_calls: int) -> tuple[list[float], collections.Counter[str]]:
    errors: collections.Counter[str] = collections.Counter()
    results = await asyncio.gather(*(one_chain(url, i, num_calls, errors) for i in range(num_sessions)))
    return [r for r in results if r is not None], errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a model name or folder (default: a tiny random LLaMA)")
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--calls", type=int, default=3, help="dependent calls per session")
    args = parser.parse_args()
    engine = AsyncEngine(engine_config(args.model))
    engine.start()
    manager = create_manager([engine], config=ManagerConfig(sharing=SharingConfig(prefix_sharing=False)))
    try:
        free_before = engine.engine.stats().num_blocks_free
        with ServerThread(create_app(manager, connect_engine=connect_engine)) as server:
            t0 = time.monotonic()
            latencies, errors = asyncio.run(probe(server.url, args.sessions, args.calls))
            wall = time.monotonic() - t0
        free_after = engine.engine.stats().num_blocks_free
    finally:
        engine.stop()
    done = len(latencies) * args.calls
    print(
        f"{done}/{args.sessions * args.calls} calls in {wall:.1f} s; "
        f"session latency p50 {percentile(latencies, 0.5):.2f} s, "
        f"p95 {percentile(latencies, 0.95):.2f} s, p99 {percentile(latencies, 0.99):.2f} s, max {max(latencies):.2f} s "
        f"(mean {statistics.mean(latencies):.2f} s); errors {dict(errors) or 'none'}; "
        f"KV blocks free {free_before} before, {free_after} after"
    )


if __name__ == "__main__":
    main()
