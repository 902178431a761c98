"""Native CPU kernels against torch ops: two engines on the same model in the same run (A/B,
interleaved), one with `EngineConfig.cpu_kernels` (the native transform, native decode attention
and sampling), one without.

    python -m benchmarks.kernel_ab [d1 d8 d32 d64 p128 p512 p2048] [--fused | --attention-ab | --amx-attention-ab |
        --float32-ab elementwise|onednn] [--prompt-len N]

dN: one decode step with N sequences (32-token prompts), driven in this thread through
`LLMEngine.step()` (the engine's loop thread stopped) so that only the step itself is timed; pN: a
prompt of N tokens to its first token (fill + generate submitted together, the loop thread
running); pKxN: K prompts of N tokens submitted at once, to the last one's first token.
Each case runs `--rounds` rounds (3); each round times both engines, in alternating
order, and the best of each is reported (and, with more than 3 rounds, the median: on a loaded
machine the best is luck). Only the engine being timed works; the other waits idle.

--attention-ab: one engine, its decode attention by turns on the native kernels (the backend the
engine built) and on torch (the same backend class built with native=False, over the same KV
cache): what the native decode kernels save in a whole step, the rest of the step alike. With
--prompt-len, decode steps attend over longer contexts (a decode case's prompts; default 32).

--float32-ab (a float32 engine on its AVX2 kernels): one engine, by turns with and without one of
its pieces: `elementwise`, RMSNorm / RoPE / SiLU*up on the kernels or on torch's ops; `onednn`,
steps above `blocks.MAX_ROWS` (40) rows on oneDNN's prepacked weights or on torch's matmul (MKL);
`rows`, steps of 41-64 rows on oneDNN or on the block kernels (their limit before: 64). E.g.
`python -m benchmarks.kernel_ab d40 d48 d56 d64 --float32-ab rows --prompt-len 48 --rounds 6`.

--amx-attention-ab (a bf16 engine on an AMX CPU): one engine, by turns its paged decode and prefill
attention on AMX tiles (the default there) and on AVX512-BF16 (`kernels.attention_amx`).

--fused: one engine on the native kernels (bf16, or float32 over the block kernels), by turns
running each decoder layer in one native call (kernels.FusedDecoderLayer, the default) and the
same kernels one op at a time
(`kernels.set_fused(model, False)`): what the per-op Python and ctypes overhead costs. (One
engine, not two: in an A/A run of two engines built alike, where nothing was fused, their
decode steps at 1-4 rows differed by 9-14%.)
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import random
import statistics
import time
from collections.abc import Callable

import torch

from parrot.engine import kernels, sync_client
from parrot.engine.config import DTYPES, EngineConfig, resolve_dtype
from parrot.engine.kernels import blocks, library, ops
from parrot.engine.kernels.pieces import PackedWeight
from parrot.engine.llm_engine import LLMEngine
from parrot.engine.model.loader import DEFAULT_MODEL, resolve_model_folder
from parrot.protocol import FillRequest, FreeContextRequest, GenerateRequest, SamplingParams

ROWS_BEFORE = 64  # `--float32-ab rows`: the block kernels' row limit before oneDNN took 41-64 rows


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
            sync_client.fill(eng, FillRequest(context_id=c, token_ids=self.prompt(prompt_len)))
        eng.stop()
        sampling = SamplingParams(max_tokens=steps + 2, ignore_eos=True)
        for c in cids:
            eng.submit_generate(GenerateRequest(context_id=c, sampling=sampling), lambda e: None)
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
            eng.free_context(FreeContextRequest(context_id=c))
        return elapsed * 1000

    def prefill_ms(self, n: int, count: int = 1) -> float:
        """`count` prompts of n tokens submitted at once, to the last one's first token."""
        cids = [f"p{next(self.ids)}" for _ in range(count)]
        prompts = [self.prompt(n) for _ in cids]
        t0 = time.perf_counter()
        waits = []
        for cid, prompt in zip(cids, prompts, strict=True):
            sync_client.submit_fill(self.engine, FillRequest(context_id=cid, token_ids=prompt))
            req = GenerateRequest(context_id=cid, sampling=SamplingParams(max_tokens=1))
            waits.append(sync_client.submit_generate(self.engine, req))
        for w in waits:
            sync_client.wait_generate(w)
        elapsed = time.perf_counter() - t0
        for cid in cids:
            self.engine.free_context(FreeContextRequest(context_id=cid))
        return elapsed * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="*", default=["d1", "d8", "d32", "d64", "p128", "p512", "p2048"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fused", action="store_true", help="fused layers vs the per-op native path")
    ap.add_argument("--attention-ab", action="store_true", help="native decode attention vs torch, one engine")
    ap.add_argument("--amx-attention-ab", action="store_true", help="attention on AMX vs AVX512-BF16, one engine")
    ap.add_argument("--float32-ab", choices=["elementwise", "onednn", "rows"], help="a float32 piece on or off")
    ap.add_argument("--prompt-len", type=int, default=32, help="decode cases: each sequence's prompt tokens")
    ap.add_argument("--no-batch-invariant", action="store_true", help="the per-context mode (default: auto)")
    ap.add_argument("--attention", help="the attention backend outside the batch-invariant mode (default: config's)")
    ap.add_argument("--dtype", choices=DTYPES, default="auto", help="float32: the block kernels against torch")
    a = ap.parse_args()
    dtype = "float32" if a.float32_ab else resolve_dtype(a.dtype)
    if dtype == "bfloat16" and not kernels.available():
        raise SystemExit(f"native kernels {kernels.status()}")
    if dtype == "float32" and library.blocks_library() is None:
        raise SystemExit(f"block kernels {library.blocks_status()}")
    torch.set_num_threads(a.threads)
    folder = resolve_model_folder(DEFAULT_MODEL)
    config = EngineConfig(model=str(folder), dtype=dtype, max_num_batched_tokens=4096, cpu_kernels=True)
    if a.no_batch_invariant:
        config = dataclasses.replace(config, batch_invariant=False)
    if a.attention:
        config = dataclasses.replace(config, attention=a.attention)
    backends = {}
    switch: Callable[[bool], None] | None = None  # --float32-ab: turns the piece on or off
    one_engine = a.fused or a.attention_ab or a.float32_ab or a.amx_attention_ab
    if one_engine:  # one engine, two paths by turns: the same memory, KV, weights
        engine = LLMEngine(config)
        engines = {True: engine}
        timers = {on: StepTimer(engine, seed=int(on)) for on in (True, False)}  # (no prefix cache hits)
        if a.attention_ab:
            built = engine.runner.backend
            mc = engine.model.cfg
            torch_path = type(built)(engine.cache, mc.num_heads, mc.num_kv_heads, mc.head_dim, False)
            assert built.native and not torch_path.native, "no native decode attention for this cache"
            backends = {True: built, False: torch_path}
        if a.float32_ab:
            switch = float32_switch(engine, a.float32_ab)
        if a.amx_attention_ab:
            if not kernels.attention_amx():
                raise SystemExit("attention does not run on AMX here (no AMX, or the OS refused its tile state)")
            switch = kernels.attention_amx
    else:
        engines = {on: LLMEngine(dataclasses.replace(config, cpu_kernels=on)) for on in (True, False)}
        timers = {native: StepTimer(engine) for native, engine in engines.items()}  # same prompts for both
    status = engines[True].stats().native_kernels
    assert not status.startswith("unavailable"), status
    names = (
        ("fused", "per-op") if a.fused else ("native attention", "torch") if a.attention_ab else ("kernels", "torch")
    )
    if a.float32_ab:
        names = ("oneDNN", "block kernels") if a.float32_ab == "rows" else (a.float32_ab, "torch")
    mode = "batch-invariant" if engines[True].batch_invariant else "per-context"
    what = "fused layers vs per-op native" if a.fused else "native kernels vs torch ops"
    if a.attention_ab:
        what = f"{type(backends[True]).__name__} decode attention, native vs torch"
    if a.float32_ab:
        what = f"float32 {a.float32_ab} on vs off"
    if a.amx_attention_ab:
        names, what = ("AMX", "AVX512-BF16"), "paged attention on AMX vs AVX512-BF16"
    print(f"{DEFAULT_MODEL} {dtype}, {a.threads} threads, {mode} mode: best of {a.rounds}, {what} ({status})")
    for engine in engines.values():
        engine.start()
    try:
        for case in a.cases:
            kind, (count, n) = case[0], (int(x) for x in case[1:].split("x")) if "x" in case else (1, int(case[1:]))
            times: dict[bool, list[float]] = {True: [], False: []}
            for round_idx in range(a.rounds):
                for native in (True, False) if round_idx % 2 == 0 else (False, True):
                    timer = timers[native]
                    if a.fused:
                        kernels.set_fused(timer.engine.model, native)
                    if backends:
                        timer.engine.runner.backend = backends[native]
                    if switch is not None:
                        switch(native)
                    times[native].append(
                        timer.decode_ms(n, a.prompt_len) if kind == "d" else timer.prefill_ms(n, count)
                    )
            best = {native: min(ms) for native, ms in times.items()}
            label = f"decode step, batch {n} x {a.prompt_len}" if kind == "d" else f"{count} x {n}-token prompts"
            ratio = best[False] / best[True]
            line = f"{label}: {names[0]} {best[True]:.1f} ms, {names[1]} {best[False]:.1f} ms, {ratio:.2f}x"
            if a.rounds > 3:
                med = {native: statistics.median(ms) for native, ms in times.items()}
                line += f" (medians {med[True]:.1f} / {med[False]:.1f} ms, {med[False] / med[True]:.2f}x)"
            print(line)
    finally:
        if switch is not None:
            switch(True)  # the piece back on (elementwise patches a module global)
        for engine in engines.values():
            engine.stop()


def float32_switch(engine: LLMEngine, piece: str) -> Callable[[bool], None]:
    """on/off for one piece of a float32 engine: its elementwise kernels (ops' library lookup),
    oneDNN (each block piece's packed weights, swapped for a packer that packs nothing), or oneDNN
    for steps of `blocks.MAX_ROWS`+1 to 64 rows (off: the block kernels' limit before, 64)."""
    if piece == "elementwise":

        def elementwise(on: bool) -> None:
            ops.blocks_library = library.blocks_library if on else lambda: None

        return elementwise
    if piece == "rows":  # steps of 41-64 rows on oneDNN (today's limit) or on the block kernels
        limit = blocks.MAX_ROWS

        def rows(on: bool) -> None:
            blocks.MAX_ROWS = limit if on else ROWS_BEFORE

        return rows
    pieces = [m for m in engine.model.modules() if isinstance(m, (blocks.BlockLinear, blocks.BlockLMHead))]
    assert pieces, "no block pieces: not a float32 engine on its kernels"
    packed = {id(m): m.packed for m in pieces}
    none: PackedWeight[torch.Tensor] = PackedWeight(lambda w: None, torch.float32)

    def onednn(on: bool) -> None:
        for m in pieces:
            m.packed = packed[id(m)] if on else none

    return onednn


if __name__ == "__main__":
    main()
