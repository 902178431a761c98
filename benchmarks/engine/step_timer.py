"""Times one engine's steps from outside its loop: a decode step of N sequences with the loop
thread stopped (only the step is timed), and prompts to their first token with the loop running.
The engine benchmarks' A/Bs (kernels.py, commits.py) and the step profile (benchmarks/apps/
step_profile.py) measure through it."""

from __future__ import annotations

import itertools
import random
import time

from parrot.engine import sync_client
from parrot.engine.llm_engine import LLMEngine
from parrot.protocol import ExtendRequest, FreeContextRequest, SamplingParams


class StepTimer:
    def __init__(self, engine: LLMEngine, seed: int = 0) -> None:
        self.engine = engine
        self.rng = random.Random(seed)
        self.ids = itertools.count()

    def prompt(self, n: int) -> list[int]:
        return [self.rng.randrange(100, 40000) for _ in range(n)]

    def decode_ms(self, batch: int, prompt_len: int = 32, steps: int = 12) -> float:
        """Mean step time with `batch` sequences decoding (the loop thread stopped, steps run here)."""
        eng = self.engine
        cids = [f"d{next(self.ids)}" for _ in range(batch)]
        for c in cids:
            sync_client.extend_only(eng, ExtendRequest(context_id=c, token_ids=self.prompt(prompt_len)))
        eng.stop()
        sampling = SamplingParams(max_tokens=steps + 2, ignore_eos=True)
        for c in cids:
            eng.submit_extend(ExtendRequest(context_id=c, append=True, sampling=sampling), lambda e: None)
        try:
            assert eng.step() and eng.step()  # warm: packs weights, sizes buffers
            t0 = time.perf_counter()
            for _ in range(steps - 2):
                assert eng.step()
            elapsed = (time.perf_counter() - t0) / (steps - 2)
            while eng.step():  # the generations' last tokens
                pass
        finally:
            eng.start()
        for c in cids:
            eng.free(FreeContextRequest(context_id=c))
        return elapsed * 1000

    def prefill_ms(self, n: int, count: int = 1) -> float:
        """`count` prompts of n tokens submitted at once, to the last one's first token."""
        cids = [f"p{next(self.ids)}" for _ in range(count)]
        prompts = [self.prompt(n) for _ in cids]
        t0 = time.perf_counter()
        waits = []
        for cid, prompt in zip(cids, prompts, strict=True):
            sync_client.submit(self.engine, ExtendRequest(context_id=cid, token_ids=prompt))
            req = ExtendRequest(context_id=cid, append=True, sampling=SamplingParams(max_tokens=1))
            waits.append(sync_client.submit(self.engine, req))
        for w in waits:
            sync_client.wait(w)
        elapsed = time.perf_counter() - t0
        for cid in cids:
            self.engine.free(FreeContextRequest(context_id=cid))
        return elapsed * 1000
