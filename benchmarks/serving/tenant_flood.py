"""Tenant isolation: one tenant's 4-token call, unloaded and while another tenant floods the manager.

    python -m benchmarks.serving.tenant_flood     # the tiny random model (seconds)
    python -m benchmarks.serving.tenant_flood --model smollm2-135m --flood 64 --flood-words 4000 [--await-flood]

Prints the victim's median latency unloaded and during the flood, and their ratio (the issue's
target: within 2x). Rounds alternate unloaded and flooded probes; medians of `--repeats`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from parrot.engine.async_engine import AsyncEngine
from parrot.engine.config import EngineConfig
from parrot.engine.model.loader import DEFAULT_MODEL, resolve_model_folder, write_tiny_model
from parrot.protocol.public_api import CallSpec, SubmitRequest
from parrot.protocol.sampling import SamplingParams
from parrot.serve import ManagerConfig, create_manager
from parrot.serve.config import SchedulingConfig, SharingConfig
from parrot.serve.manager import Manager

PROBE = SamplingParams(max_tokens=4, ignore_eos=True)


async def timed_call(manager: Manager, api_key: str, template: str, sampling: SamplingParams) -> float:
    created = manager.create_session(api_key)
    session = manager.session(created.session_id, created.token)
    start = time.monotonic()
    manager.submit(session, SubmitRequest(calls=[CallSpec(template=template, default_sampling=sampling)]))
    await manager.get_variable(session, "c0~o", timeout_s=600)
    return time.monotonic() - start


async def run(
    engine: AsyncEngine, num_flood: int, flood_words: int, repeats: int, await_flood: bool = False
) -> tuple[float, float]:
    manager = create_manager(
        [engine],
        config=ManagerConfig(
            scheduling=SchedulingConfig(max_running_calls_per_engine=16), sharing=SharingConfig(prefix_sharing=False)
        ),
    )
    await manager.start()
    try:
        unloaded = [await timed_call(manager, "victim", "Hi there{{output:o}}", PROBE) for _ in range(repeats)]
        created = manager.create_session("flooder")
        flood = manager.session(created.session_id, created.token)
        text = "word " * flood_words
        calls = [
            CallSpec(template=f"{i} {text}{{{{output:o}}}}", default_sampling=SamplingParams(max_tokens=16))
            for i in range(num_flood)
        ]
        submitted = manager.submit(flood, SubmitRequest(calls=calls))
        # Awaited, the flood's calls are as urgent as the victim's (a person waits on each): only
        # the fair share between tenants tells them apart.
        awaited = submitted.calls if await_flood else []
        gets = [asyncio.ensure_future(manager.get_variable(flood, c.outputs["o"], timeout_s=600)) for c in awaited]
        await asyncio.sleep(1.0)  # the flood occupies the engine
        loaded = [await timed_call(manager, "victim", "Hi there{{output:o}}", PROBE) for _ in range(repeats)]
        for get in gets:
            get.cancel()
        return statistics.median(unloaded), statistics.median(loaded)
    finally:
        await manager.stop()


def engine_config(model: str | None) -> EngineConfig:
    """`model` (a name or folder) as the default engine runs it, or None: a tiny random LLaMA in
    float32 with the default model's tokenizer (seconds of work, for what the manager does)."""
    if model is not None:
        return EngineConfig(model=model)
    folder = write_tiny_model(Path(tempfile.mkdtemp()) / "tiny", tokenizer_from=resolve_model_folder(DEFAULT_MODEL))
    return EngineConfig(model=str(folder), dtype="float32", num_blocks=8192, block_size=16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a model name or folder (default: a tiny random LLaMA)")
    parser.add_argument("--flood", type=int, default=200, help="calls the flooding tenant submits")
    parser.add_argument("--flood-words", type=int, default=1000, help="prompt words of each flood call")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--await-flood", action="store_true", help="the flooding tenant awaits every output")
    args = parser.parse_args()
    engine = AsyncEngine(engine_config(args.model))
    engine.start()
    try:
        unloaded, loaded = asyncio.run(run(engine, args.flood, args.flood_words, args.repeats, args.await_flood))
    finally:
        engine.stop()
    print(
        f"victim's 4-token call: unloaded {unloaded * 1000:.0f} ms, during the flood {loaded * 1000:.0f} ms "
        f"({loaded / unloaded:.1f}x; target <= 2x)"
    )


if __name__ == "__main__":
    main()
