"""Parrot's builtin engine measured with the same two probes as the peers (in process)."""

from __future__ import annotations

import random
import time

import torch

from benchmarks.peers import prefill_rates
from parrot.engine import sync_client
from parrot.engine.config import EngineConfig
from parrot.engine.llm_engine import LLMEngine
from parrot.protocol import ExtendRequest, FreeContextRequest, SamplingParams


class ParrotEngineProbe:
    def __init__(self, model_folder: str, dtype: str = "bfloat16", num_threads: int = 2, repeats: int = 3) -> None:
        torch.set_num_threads(num_threads)
        self.repeats = repeats  # prefill prompts per length, after a warm-up
        self.engine = LLMEngine(EngineConfig(model=model_folder, dtype=dtype, max_num_batched_tokens=4096))
        self.engine.start()
        self._rng = random.Random(0)
        self._n = 0

    def close(self) -> None:
        self.engine.stop()

    def _prompt(self, n: int) -> list[int]:
        return [self._rng.randrange(100, 40000) for _ in range(n)]

    def _cid(self) -> str:
        self._n += 1
        return f"bench{self._n}"

    def measure_prefill(self, lengths: list[int]) -> dict[int, float]:
        """Median over `repeats` distinct prompts of prompt_len / time to the single output token
        (`prefill_rates`, as the peers); the prompt and its generation go as one request
        (one Extend with tokens and sampling), as the manager sends a call's last piece."""

        def seconds(prompt_len: int, _r: int) -> float:
            cid = self._cid()
            one_token = SamplingParams(max_tokens=1)
            req = ExtendRequest(context_id=cid, token_ids=self._prompt(prompt_len), sampling=one_token)
            t0 = time.perf_counter()
            sync_client.wait(sync_client.submit(self.engine, req))
            elapsed = time.perf_counter() - t0
            self.engine.free(FreeContextRequest(context_id=cid))
            return elapsed

        return prefill_rates(lengths, self.repeats, seconds)

    def measure_decode(self, batch_sizes: list[int], new_tokens: int = 32, prompt_len: int = 32) -> dict[int, float]:
        """Generated tokens per second with `b` sequences decoding together (prefill excluded)."""
        out: dict[int, float] = {}
        for b in batch_sizes:
            cids = [self._cid() for _ in range(b)]
            for cid in cids:
                sync_client.extend_only(self.engine, ExtendRequest(context_id=cid, token_ids=self._prompt(prompt_len)))
            sampling = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
            t0 = time.perf_counter()
            handles = [
                sync_client.submit(self.engine, ExtendRequest(context_id=c, append=True, sampling=sampling))
                for c in cids
            ]
            for h in handles:
                sync_client.wait(h)
            out[b] = b * new_tokens / (time.perf_counter() - t0)
            for cid in cids:
                self.engine.free(FreeContextRequest(context_id=cid))
        return out
