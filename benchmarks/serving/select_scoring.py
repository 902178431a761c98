"""A select among k options: scored (one fill of the prompt, then a short scoring fill per option
as a fork of it, no generation) vs generated under the choices grammar, on the builtin engine.

    python -m benchmarks.serving.select_scoring     # SmolLM2-135M, 4 options, 7 rounds

Rounds alternate the two ways (interleaved); prints the median latency of each, their ratio, and
the engine's counters for one call of each: prompt tokens computed and tokens generated.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from parrot.engine.async_engine import AsyncEngine
from parrot.engine.config import EngineConfig
from parrot.protocol.public_api import CallSpec, SubmitRequest
from parrot.protocol.sampling import SamplingParams
from parrot.serve import ManagerConfig, create_manager
from parrot.serve.config import SharingConfig
from parrot.serve.manager import Manager

OPTIONS = ["positive", "negative", "neutral", "mixed feelings"]
PROMPT = "Review: the food was cold but the staff were lovely and the view was great.\nSentiment:{{output:s}}"


async def one(manager: Manager, engine: AsyncEngine, scored: bool, i: int) -> tuple[float, int, int]:
    """(seconds, prompt tokens computed, tokens generated) of one select call."""
    created = manager.create_session("bench")
    session = manager.session(created.session_id, created.token)
    sampling = SamplingParams(max_tokens=8, choices=OPTIONS, score_choices=scored)
    before = await engine.stats()
    start = time.monotonic()
    spec = CallSpec(template=f"[{i}] {PROMPT}", sampling={"s": sampling})  # distinct prompts: no cache hits
    manager.submit(session, SubmitRequest(calls=[spec]))
    await manager.get_variable(session, "c0~s", timeout_s=120)
    seconds = time.monotonic() - start
    await manager.delete_session(session)
    await asyncio.sleep(0.2)  # the call's contexts are freed
    after = await engine.stats()
    return (
        seconds,
        after.num_prefill_tokens - before.num_prefill_tokens,
        after.num_decode_tokens - before.num_decode_tokens,
    )


async def run(engine: AsyncEngine, rounds: int) -> None:
    manager = create_manager([engine], config=ManagerConfig(sharing=SharingConfig(prefix_sharing=False)))
    await manager.start()
    try:
        await one(manager, engine, True, -1)  # warm-up
        times: dict[bool, list[float]] = {True: [], False: []}
        counts: dict[bool, tuple[int, int]] = {}
        for r in range(rounds):
            for scored in (True, False) if r % 2 == 0 else (False, True):
                seconds, prefill, decode = await one(manager, engine, scored, r)
                times[scored].append(seconds)
                counts[scored] = (prefill, decode)
        for scored, name in ((True, "scored"), (False, "grammar")):
            med = statistics.median(times[scored])
            prefill, decode = counts[scored]
            print(f"{name:8s} median {1000 * med:.0f} ms; prompt tokens computed {prefill}, generated {decode}")
        print(f"grammar / scored: {statistics.median(times[False]) / statistics.median(times[True]):.2f}x")
    finally:
        await manager.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    engine = AsyncEngine(EngineConfig(model=args.model))
    engine.start()
    try:
        asyncio.run(run(engine, args.rounds))
    finally:
        engine.stop()


if __name__ == "__main__":
    main()
