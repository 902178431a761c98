"""What the batch-invariant mode costs: two engines on the same model in one run (A/B,
interleaved), one with `EngineConfig.batch_invariant`, one without (both bf16, native kernels).

    python -m benchmarks.invariance_ab [d1 d8 d32 p128 p512 p2048 p128x8 p128x32]

dN: one decode step with N sequences (as benchmarks.kernel_ab); pN: a prompt of N tokens to its
first token; pNxB: B prompts of N tokens submitted together, to the last first token. Each case
runs `--rounds` rounds; each round times both engines, in alternating order; the median of each is
reported with the ratio invariant / default (above 1: the mode is slower).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import torch

from benchmarks.kernel_ab import StepTimer
from parrot.engine import kernels, sync_client
from parrot.engine.config import EngineConfig
from parrot.engine.llm_engine import LLMEngine
from parrot.engine.model.loader import DEFAULT_MODEL, resolve_model_folder
from parrot.protocol import FillRequest, FreeContextRequest, GenerateRequest, SamplingParams


def batch_prefill_ms(timer: StepTimer, n: int, batch: int) -> float:
    """`batch` prompts of `n` tokens submitted together, until the last has its first token."""
    eng = timer.engine
    cids = [f"p{next(timer.ids)}" for _ in range(batch)]
    t0 = time.perf_counter()
    handles = []
    for c in cids:
        sync_client.submit_fill(eng, FillRequest(context_id=c, token_ids=timer.prompt(n)))
        req = GenerateRequest(context_id=c, sampling=SamplingParams(max_tokens=1))
        handles.append(sync_client.submit_generate(eng, req))
    for h in handles:
        sync_client.wait_generate(h)
    elapsed = time.perf_counter() - t0
    for c in cids:
        eng.free_context(FreeContextRequest(context_id=c))
    return elapsed * 1000


def measure(timer: StepTimer, case: str) -> float:
    if case[0] == "d":
        return timer.decode_ms(int(case[1:]))
    n, _, batch = case[1:].partition("x")
    return timer.prefill_ms(int(n)) if not batch else batch_prefill_ms(timer, int(n), int(batch))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="*", default=["d1", "d8", "d32", "p128", "p512", "p2048", "p128x8", "p128x32"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    folder = resolve_model_folder(DEFAULT_MODEL)
    config = EngineConfig(model=str(folder), dtype="bfloat16", max_num_batched_tokens=2048)
    engines = {inv: LLMEngine(dataclasses.replace(config, batch_invariant=inv)) for inv in (True, False)}
    timers = {inv: StepTimer(engine) for inv, engine in engines.items()}  # same prompts for both
    print(f"{DEFAULT_MODEL} bf16, {a.threads} threads, kernels {kernels.status()}: median of {a.rounds} rounds")
    for engine in engines.values():
        engine.start()
    try:
        for case in a.cases:
            times: dict[bool, list[float]] = {True: [], False: []}
            for round_idx in range(a.rounds):
                for inv in (True, False) if round_idx % 2 == 0 else (False, True):
                    times[inv].append(measure(timers[inv], case))
            on, off = statistics.median(times[True]), statistics.median(times[False])
            print(f"{case}: invariant {on:.1f} ms, default {off:.1f} ms, cost {on / off:.2f}x", flush=True)
    finally:
        for engine in engines.values():
            engine.stop()


if __name__ == "__main__":
    main()
