"""Prefill attention per layer on this machine: the native chunk kernel against the same rows
attended one by one, and against torch's SDPA (a program, not a test).

    python -m benchmarks.attention.prefill [--rounds 5] [--dtype bfloat16|float32] [--out DIR]

One chunk of T new tokens after S - T cached ones, the default model's attention shape (9 query /
3 KV heads of 64; bf16 on the AVX512-BF16 kernels, float32 on the AVX2 ones, by default whichever
this CPU runs), its K/V in a paged cache of 16-token blocks:
  - chunk: `kernels.paged_prefill`, each 64-token key tile packed once for all the chunk's rows;
  - per row: `kernels.paged_decode` over the chunk's rows, each with its own length (bf16: the same
    per-row arithmetic, the same bits; what the batch-invariant mode ran before the chunk kernel);
  - sdpa: the engine's torch path (`PagedAttention` without native kernels: flash SDPA, causal).
Each figure is the median of `--rounds` rounds that alternate the paths; within a round a call
repeats for 0.2 s. Writes prefill_attention.json, prefill_attention.md and manifest.json to `--out`
(default bench_results/attention-prefill-<machine kind>).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.common.resultset import default_out, write_manifest
from parrot.engine import kernels
from parrot.engine.attention.base import PagedAttention, SeqSpec, gather_blocks
from parrot.engine.kernels import library
from parrot.engine.kv.cache import KVCache

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 16
CASES = [(128, 128), (512, 512), (1024, 1024), (2048, 2048), (100, 1400), (300, 1400)]  # (T, S)


def per_call_ms(fn: Callable[[], object], seconds: float = 0.2) -> float:
    fn()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    return (time.perf_counter() - t0) / n * 1e3


def paths(t: int, s: int, dtype: torch.dtype) -> dict[str, Callable[[], object]]:
    blocks = -(-s // BLOCK)
    cache = KVCache(1, blocks, BLOCK, KV_HEADS, HEAD_DIM, dtype)
    cache.k.normal_()
    cache.v.normal_()
    ids = torch.arange(blocks)
    q = torch.randn(t, HEADS, HEAD_DIM).to(dtype)
    k_cache, v_cache, scale = cache.k[0], cache.v[0], HEAD_DIM**-0.5
    tables, lens = ids.expand(t, -1).contiguous(), torch.arange(s - t + 1, s + 1)
    sdpa = PagedAttention(cache, HEADS, KV_HEADS, HEAD_DIM, native=False)
    sdpa.prepare([SeqSpec(t, s, ids.tolist())], torch.empty(0, dtype=torch.long))
    new_k, new_v = gather_blocks(k_cache, ids)[s - t : s], gather_blocks(v_cache, ids)[s - t : s]
    return {
        "chunk": lambda: kernels.paged_prefill(q, k_cache, v_cache, ids, s, scale),
        "per row": lambda: kernels.paged_decode(q, k_cache, v_cache, tables, lens, scale),
        "sdpa": lambda: sdpa.prefill(0, sdpa.prefills[0], q, new_k, new_v),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", choices=["bfloat16", "float32"], help="default: bfloat16 where its kernels run")
    ap.add_argument("--out", type=Path, help="default: bench_results/attention-prefill-<machine kind>")
    a = ap.parse_args()
    a.out = a.out or default_out("attention-prefill")
    dtype = getattr(torch, a.dtype or ("bfloat16" if kernels.available() else "float32"))
    status = kernels.status() if dtype == torch.bfloat16 else library.blocks_status()
    if not (kernels.available() if dtype == torch.bfloat16 else library.blocks_library() is not None):
        raise SystemExit(f"native kernels {status}")
    torch.set_num_threads(a.threads)
    rows = []
    with torch.inference_mode():
        for t, s in CASES:
            fns = paths(t, s, dtype)
            times: dict[str, list[float]] = {name: [] for name in fns}
            for r in range(a.rounds):
                for name in list(fns) if r % 2 == 0 else list(fns)[::-1]:
                    times[name].append(per_call_ms(fns[name]))
            med = {name: statistics.median(v) for name, v in times.items()}
            flops = 4 * HEADS * HEAD_DIM * sum(s - t + i + 1 for i in range(t))  # Q.K and P.V, causal
            rows.append({"new": t, "tokens": s, "ms": med, "gflops": {n: flops / m / 1e6 for n, m in med.items()}})
            print(f"T={t} S={s}: " + ", ".join(f"{n} {m:.2f} ms" for n, m in med.items()), flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "prefill_attention.json").write_text(
        json.dumps({"kernels": status, "dtype": str(dtype), "rows": rows}, indent=1)
    )
    lines = [
        f"Prefill attention per layer, 9/3 heads x 64, {str(dtype).removeprefix('torch.')}, {a.threads} threads,"
        f" kernels {status};"
        f" medians of {a.rounds} interleaved rounds.",
        "",
        "| new tokens | sequence | chunk ms | per row ms | sdpa ms | chunk GFLOP/s | per row / chunk | sdpa / chunk |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        m = row["ms"]
        lines.append(
            f"| {row['new']} | {row['tokens']} | {m['chunk']:.2f} | {m['per row']:.2f} | {m['sdpa']:.2f} | "
            f"{row['gflops']['chunk']:.0f} | {m['per row'] / m['chunk']:.2f}x | {m['sdpa'] / m['chunk']:.2f}x |"
        )
    (a.out / "prefill_attention.md").write_text("\n".join(lines) + "\n")
    write_manifest(a.out, "attention-prefill")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
