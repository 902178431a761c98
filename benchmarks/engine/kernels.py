"""Native CPU kernels against torch ops: two engines on the same model in the same run (A/B,
interleaved), one with `EngineConfig.cpu_kernels` (the native transform, native decode attention
and sampling), one without; or another A/B of one engine's pieces (below).

    python -m benchmarks.engine.kernels [d1 d8 d32 d64 p128 p512 p2048] [--fused | --attention-ab |
        --amx-attention-ab | --float32-ab elementwise|onednn|rows | --invariant-ab] [--prompt-len N]

dN: one decode step with N sequences (32-token prompts), driven in this thread through
`LLMEngine.step()` (the engine's loop thread stopped) so that only the step itself is timed; pN: a
prompt of N tokens to its first token (fill + generate submitted together, the loop thread
running); pKxN: K prompts of N tokens submitted at once, to the last one's first token.
Each case runs `--rounds` rounds (3); each round times both engines, in alternating
order, and the best of each is reported (and, with more than 3 rounds, the median: on a loaded
machine the best is luck). Only the engine being timed works; the other waits idle. Each line's
ratio is the second side's time over the first's (above 1: the first is faster). Writes
results.json, results.md and manifest.json to `--out` (default bench_results/engine-kernels-<machine
kind>).

--attention-ab: one engine, its decode attention by turns on the native kernels (the backend the
engine built) and on torch (the same backend class built with native=False, over the same KV
cache): what the native decode kernels save in a whole step, the rest of the step alike. With
--prompt-len, decode steps attend over longer contexts (a decode case's prompts; default 32).

--float32-ab (a float32 engine on its AVX2 kernels): one engine, by turns with and without one of
its pieces: `elementwise`, RMSNorm / RoPE / SiLU*up on the kernels or on torch's ops; `onednn`,
steps above `blocks.MAX_ROWS` (40) rows on oneDNN's prepacked weights or on torch's matmul (MKL);
`rows`, steps of 41-64 rows on oneDNN or on the block kernels (which can take up to 64). E.g.
`python -m benchmarks.engine.kernels d40 d48 d56 d64 --float32-ab rows --prompt-len 48 --rounds 6`.

--amx-attention-ab (a bf16 engine on an AMX CPU): one engine, by turns its paged decode and prefill
attention on AMX tiles (the default there) and on AVX512-BF16 (`kernels.attention_amx`).

--fused: one engine on the native kernels (bf16, or float32 over the block kernels), by turns
running each decoder layer in one native call (kernels.FusedDecoderLayer, the default) and the
same kernels one op at a time
(`kernels.set_fused(model, False)`): what the per-op Python and ctypes overhead costs. (One
engine, not two: in an A/A run of two engines built alike, where nothing was fused, their
decode steps at 1-4 rows differed by 9-14%.)

--invariant-ab: two engines on the native kernels, one in the batch-invariant mode
(`EngineConfig.batch_invariant`), one in the per-context mode: what the mode costs. E.g.
`python -m benchmarks.engine.kernels d1 d8 d32 p128 p512 p2048 p8x128 p32x128 --invariant-ab --rounds 5`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks.common.resultset import default_out, write_manifest
from benchmarks.engine.step_timer import StepTimer
from parrot.engine import kernels
from parrot.engine.config import DTYPES, EngineConfig, resolve_dtype
from parrot.engine.kernels import blocks, library, ops
from parrot.engine.kernels.pieces import PackedWeight
from parrot.engine.llm_engine import LLMEngine
from parrot.engine.model.loader import DEFAULT_MODEL, resolve_model_folder

ROWS_BLOCKS = 64  # `--float32-ab rows`, off: the block kernels take steps of up to 64 rows (oneDNN none)


@dataclass
class AB:
    """The two sides of a comparison: side True (the first named) and side False, each timed by its
    own `StepTimer`; `prepare(side)` switches a one-engine comparison to that side before it is timed."""

    engines: dict[bool, LLMEngine]
    timers: dict[bool, StepTimer]
    names: tuple[str, str]
    what: str
    prepare: list[Callable[[bool], None]] = field(default_factory=list)
    restore: Callable[[], None] | None = None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="*", default=["d1", "d8", "d32", "d64", "p128", "p512", "p2048"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fused", action="store_true", help="fused layers vs the per-op native path")
    ap.add_argument("--attention-ab", action="store_true", help="native decode attention vs torch, one engine")
    ap.add_argument("--amx-attention-ab", action="store_true", help="attention on AMX vs AVX512-BF16, one engine")
    ap.add_argument("--float32-ab", choices=["elementwise", "onednn", "rows"], help="a float32 piece on or off")
    ap.add_argument("--invariant-ab", action="store_true", help="the batch-invariant mode vs per-context")
    ap.add_argument("--prompt-len", type=int, default=32, help="decode cases: each sequence's prompt tokens")
    ap.add_argument("--no-batch-invariant", action="store_true", help="the per-context mode (default: auto)")
    ap.add_argument("--attention", help="the attention backend outside the batch-invariant mode (default: config's)")
    ap.add_argument("--dtype", choices=DTYPES, default="auto", help="float32: the block kernels against torch")
    ap.add_argument("--out", type=Path, help="default: bench_results/engine-kernels-<machine kind>")
    a = ap.parse_args()
    bad = [c for c in a.cases if not parse_case(c)]
    if bad:
        ap.error(f"cases are dN, pN or pKxN, not {bad}")
    a.out = a.out or default_out("engine-kernels")
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
    ab = build(a, config)
    status = ab.engines[True].stats().native_kernels
    assert not status.startswith("unavailable"), status
    mode = "batch-invariant" if ab.engines[True].batch_invariant else "per-context"
    if a.invariant_ab:
        mode = "both"
    modes = "both modes" if a.invariant_ab else f"{mode} mode"
    title = f"{DEFAULT_MODEL} {dtype}, {a.threads} threads, {modes}: best of {a.rounds}, {ab.what} ({status})"
    print(title)
    rows = []
    for engine in ab.engines.values():
        engine.start()
    try:
        for case in a.cases:
            rows.append(run_case(ab, case, a.rounds, a.prompt_len))
            print(rows[-1]["line"], flush=True)
    finally:
        if ab.restore is not None:
            ab.restore()
        for engine in ab.engines.values():
            engine.stop()
    meta = {"model": DEFAULT_MODEL, "dtype": dtype, "threads": a.threads, "mode": mode, "what": ab.what}
    meta |= {"kernels": status, "names": list(ab.names), "rounds": a.rounds, "prompt_len": a.prompt_len}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "results.json").write_text(json.dumps(meta | {"rows": rows}, indent=1))
    (a.out / "results.md").write_text("\n".join([title, "", *(f"- {r['line']}" for r in rows)]) + "\n")
    write_manifest(a.out, "engine-kernels")


def parse_case(case: str) -> tuple[str, int, int] | None:
    """(kind, count, tokens) of `dN` (a decode step of N sequences), `pN` (a prompt of N tokens) or
    `pKxN` (K prompts of N tokens at once); None for anything else."""
    kind, sizes = case[:1], case[1:].split("x")
    if kind not in ("d", "p") or len(sizes) > (2 if kind == "p" else 1) or not all(s.isdigit() for s in sizes):
        return None
    count, n = (int(sizes[0]), int(sizes[1])) if len(sizes) == 2 else (1, int(sizes[0]))
    return kind, count, n


def build(a: argparse.Namespace, config: EngineConfig) -> AB:
    if a.invariant_ab:  # two engines, the mode on and off
        engines = {on: LLMEngine(dataclasses.replace(config, batch_invariant=on)) for on in (True, False)}
        timers = {on: StepTimer(engine) for on, engine in engines.items()}  # same prompts for both
        return AB(engines, timers, ("invariant", "per-context"), "the batch-invariant mode vs per-context")
    if not (a.fused or a.attention_ab or a.float32_ab or a.amx_attention_ab):
        engines = {on: LLMEngine(dataclasses.replace(config, cpu_kernels=on)) for on in (True, False)}
        timers = {native: StepTimer(engine) for native, engine in engines.items()}  # same prompts for both
        return AB(engines, timers, ("kernels", "torch"), "native kernels vs torch ops")
    # One engine, two paths by turns: the same memory, KV, weights.
    engine = LLMEngine(config)
    timers = {on: StepTimer(engine, seed=int(on)) for on in (True, False)}  # (no prefix cache hits)
    ab = AB({True: engine}, timers, ("fused", "per-op"), "fused layers vs per-op native")
    if a.fused:
        ab.prepare.append(lambda on: kernels.set_fused(engine.model, on))
    if a.attention_ab:
        built = engine.runner.backend
        mc = engine.model.cfg
        torch_path = type(built)(engine.cache, mc.num_heads, mc.num_kv_heads, mc.head_dim, False)
        assert built.native and not torch_path.native, "no native decode attention for this cache"
        backends = {True: built, False: torch_path}

        def attend(on: bool) -> None:
            engine.runner.backend = backends[on]

        ab.prepare.append(attend)
        ab.names, ab.what = ("native attention", "torch"), f"{type(built).__name__} decode attention, native vs torch"
    switch: Callable[[bool], None] | None = None
    if a.float32_ab:
        switch = float32_switch(engine, a.float32_ab)
        ab.names = ("oneDNN", "block kernels") if a.float32_ab == "rows" else (a.float32_ab, "torch")
        ab.what = f"float32 {a.float32_ab} on vs off"
    if a.amx_attention_ab:
        if not kernels.attention_amx():
            raise SystemExit("attention does not run on AMX here (no AMX, or the OS refused its tile state)")
        switch = kernels.attention_amx
        ab.names, ab.what = ("AMX", "AVX512-BF16"), "paged attention on AMX vs AVX512-BF16"
    if switch is not None:
        on_off = switch
        ab.prepare.append(on_off)
        ab.restore = lambda: on_off(True)  # the piece back on (elementwise patches a module global)
    return ab


def run_case(ab: AB, case: str, rounds: int, prompt_len: int) -> dict[str, Any]:
    parsed = parse_case(case)
    assert parsed is not None
    kind, count, n = parsed
    times: dict[bool, list[float]] = {True: [], False: []}
    for round_idx in range(rounds):
        for side in (True, False) if round_idx % 2 == 0 else (False, True):
            for prepare in ab.prepare:
                prepare(side)
            timer = ab.timers[side]
            times[side].append(timer.decode_ms(n, prompt_len) if kind == "d" else timer.prefill_ms(n, count))
    best = {side: min(ms) for side, ms in times.items()}
    label = f"decode step, batch {n} x {prompt_len}" if kind == "d" else f"{count} x {n}-token prompts"
    ratio = best[False] / best[True]
    names = ab.names
    line = f"{label}: {names[0]} {best[True]:.1f} ms, {names[1]} {best[False]:.1f} ms, {ratio:.2f}x"
    med = {side: statistics.median(ms) for side, ms in times.items()}
    if rounds > 3:
        line += f" (medians {med[True]:.1f} / {med[False]:.1f} ms, {med[False] / med[True]:.2f}x)"
    return {
        "case": case,
        "label": label,
        "ms": {names[0]: times[True], names[1]: times[False]},
        "best_ms": {names[0]: best[True], names[1]: best[False]},
        "median_ms": {names[0]: med[True], names[1]: med[False]},
        "line": line,
    }


def float32_switch(engine: LLMEngine, piece: str) -> Callable[[bool], None]:
    """on/off for one piece of a float32 engine: its elementwise kernels (ops' library lookup),
    oneDNN (each block piece's packed weights, swapped for a packer that packs nothing), or oneDNN
    for steps of `blocks.MAX_ROWS`+1 to 64 rows (off: the block kernels take them, up to 64)."""
    if piece == "elementwise":

        def elementwise(on: bool) -> None:
            ops.blocks_library = library.blocks_library if on else lambda: None

        return elementwise
    if piece == "rows":  # steps of 41-64 rows on oneDNN (the engine's limit) or on the block kernels
        limit = blocks.MAX_ROWS

        def rows(on: bool) -> None:
            blocks.MAX_ROWS = limit if on else ROWS_BLOCKS

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
