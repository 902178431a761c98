"""Check and time the Triton shared-prefix decode kernels on a CUDA GPU (run on a lent GPU machine).

    python -m benchmarks.attention.gpu [--quick | --sweep] [--out DIR]
    TRITON_INTERPRET=1 python -m benchmarks.attention.gpu --dry-run   # CPU: tiny shapes, no timing

For N contexts forked from a P-token prefix (each with its own 100-1,000-token suffix, the
newest token included) in a paged KV cache (block size 16), it compares one layer's decode
attention of three paths against an fp32 per-context reference computed here:
  - torch per-context: gather each context's blocks, masked SDPA (what `PagedAttention` does);
  - triton per-context: the same kernels with no sharing (every row is a tail: a paged decode);
  - triton shared: segments read once for the whole batch, then the tails, then the merge.
Correctness: ||out - ref|| / ||ref|| (bf16/fp16 operands land near 1e-3..1e-2). Timing: each path
eagerly (`triton.testing.do_bench`: launches from Python included) and replayed from a CUDA graph
(`do_bench_cudagraph`: the GPU's time alone), three rounds with the paths alternated, medians. One
layer of a small model is a few microseconds of GPU work, so the eager figures measure the host's
launches; the graph figures compare the kernels. The table is printed last; gpu_attention_check.json
and manifest.json go to `--out` (default bench_results/attention-gpu-<model>, e.g. attention-gpu-h200;
the dry run writes only where `--out` is given).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.common.resultset import default_out, write_manifest
from parrot.engine.attention import triton_kernels
from parrot.engine.attention.shared_prefix import GroupingConfig, plan_shared_prefixes

BLOCK_SIZE = 16
NEVER_GROUP = GroupingConfig(min_group_size=1 << 30, min_shared_tokens=1 << 30)


def forked_batch(num_ctx: int, prefix_len: int, seed: int) -> tuple[list[list[int]], list[int], int]:
    """Block tables as the engine forks them: shared full prefix blocks, then each context's own."""
    rng = random.Random(seed)
    shared = prefix_len // BLOCK_SIZE
    tables, lens, next_block = [], [], shared
    for _ in range(num_ctx):
        seq_len = prefix_len + rng.randint(100, 1000)
        own = -(-seq_len // BLOCK_SIZE) - shared
        tables.append(list(range(shared)) + list(range(next_block, next_block + own)))
        lens.append(seq_len)
        next_block += own
    return tables, lens, next_block


def torch_per_context(q, k_cache, v_cache, tables, mask, scale):  # type: ignore[no-untyped-def]
    """q [B, Hq, D] -> [B, Hq * D]: each row gathers its blocks; SDPA over un-repeated KV heads."""
    b, hq, d = q.shape
    hkv = k_cache.shape[2]
    keys = k_cache[tables].flatten(1, 2).transpose(1, 2)
    vals = v_cache[tables].flatten(1, 2).transpose(1, 2)
    o = F.scaled_dot_product_attention(q.view(b, hkv, hq // hkv, d), keys, vals, attn_mask=mask, scale=scale)
    return o.reshape(b, -1)


def check(
    num_ctx: int, prefix_len: int, heads: tuple[int, int, int], dtype: torch.dtype, dev: torch.device, seed: int = 0
) -> dict:
    from triton.testing import do_bench, do_bench_cudagraph

    hq, hkv, d = heads
    tables, lens, num_blocks = forked_batch(num_ctx, prefix_len, seed)
    gen = torch.Generator(device=dev).manual_seed(seed)
    k_cache = torch.randn(num_blocks, BLOCK_SIZE, hkv, d, device=dev, generator=gen).to(dtype)
    v_cache = torch.randn(num_blocks, BLOCK_SIZE, hkv, d, device=dev, generator=gen).to(dtype)
    q = torch.randn(num_ctx, hq, d, device=dev, generator=gen).to(dtype)
    scale = d**-0.5
    width = max(len(t) for t in tables)
    padded = torch.tensor([t + [0] * (width - len(t)) for t in tables], device=dev)
    valid = torch.arange(width * BLOCK_SIZE, device=dev)[None, :] < torch.tensor(lens, device=dev)[:, None]
    mask = valid[:, None, None, :]
    ref = torch_per_context(q.float(), k_cache.float(), v_cache.float(), padded, mask, scale)

    def meta(grouping: GroupingConfig) -> triton_kernels.TritonCascadeMeta:
        plan = plan_shared_prefixes(tables, lens, BLOCK_SIZE, grouping)
        return triton_kernels.TritonCascadeMeta.build(plan, BLOCK_SIZE, hq // hkv, dev)

    shared_meta, paged_meta = meta(GroupingConfig()), meta(NEVER_GROUP)
    runs = {
        "torch_per_ctx": lambda: torch_per_context(q, k_cache, v_cache, padded, mask, scale),
        "triton_per_ctx": lambda: triton_kernels.cascade_decode(q, k_cache, v_cache, paged_meta, scale),
        "triton_shared": lambda: triton_kernels.cascade_decode(q, k_cache, v_cache, shared_meta, scale),
    }
    row: dict = {"contexts": num_ctx, "prefix": prefix_len, "heads": f"{hq}/{hkv}x{d}", "dtype": str(dtype)[6:]}
    for name, fn in runs.items():
        out = fn().float()
        row[f"err_{name}"] = float((out - ref).norm() / ref.norm())
    timed = dev.type == "cuda"  # the dry run on the CPU interpreter only checks
    benches = {
        "ms": lambda f: do_bench(f, warmup=25, rep=100, return_mode="median"),
        "graph_ms": lambda f: do_bench_cudagraph(f, rep=50, return_mode="median"),
    }
    for how, bench in benches.items():
        rounds = [[float(bench(fn)) if timed else float("nan") for fn in runs.values()] for _ in range(3)]
        for i, name in enumerate(runs):
            row[f"{how}_{name}"] = statistics.median(r[i] for r in rounds)
    kv_bytes = 2 * hkv * d * k_cache.element_size()
    row["kv_mb_per_ctx"] = sum(lens) * kv_bytes / 1e6
    row["kv_mb_saved"] = (num_ctx - 1) * (prefix_len // BLOCK_SIZE * BLOCK_SIZE) * kv_bytes / 1e6  # spared reads
    prefix_tokens = prefix_len // BLOCK_SIZE * BLOCK_SIZE  # in full blocks: what forked contexts share
    row["kv_mb_shared"] = (prefix_tokens + sum(lens) - num_ctx * prefix_tokens) * kv_bytes / 1e6
    row["shared_gbps"] = row["kv_mb_shared"] / 1e3 / (row["graph_ms_triton_shared"] / 1e3)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sweep", action="store_true", help="bf16 shapes around the cascade's break-even point")
    parser.add_argument("--dry-run", action="store_true", help="CPU tensors under TRITON_INTERPRET=1, tiny shapes")
    parser.add_argument("--out", type=Path, help="default: bench_results/attention-gpu-<model>")
    args = parser.parse_args()
    dev = torch.device("cpu" if args.dry_run else "cuda")
    reason = triton_kernels.unavailable_reason(dev)
    if reason is not None or (dev.type == "cuda" and not torch.cuda.is_available()):
        sys.exit(f"cannot run: {reason or 'no CUDA device'}")
    name = torch.cuda.get_device_name() if dev.type == "cuda" else "CPU (Triton interpreter)"
    print(f"{name}; torch {torch.__version__}; triton {triton_kernels.triton.__version__}", flush=True)
    if args.dry_run:
        shapes, extra = [(4, 300)], [(3, 300, (32, 8, 128), torch.float16), (3, 300, (9, 3, 64), torch.float32)]
    elif args.sweep:  # where grouping starts to pay: rows x shared tokens x bytes a token
        sizes = [(4, 2048), (4, 8192), (8, 2048), (8, 8192), (16, 1024), (16, 2048), (16, 4096), (32, 2048)]
        sizes += [(64, 1024), (64, 2048)]
        shapes, extra = [], [(n, p, h, torch.bfloat16) for h in ((9, 3, 64), (32, 8, 128)) for n, p in sizes]
    elif args.quick:
        shapes, extra = [(8, 1024), (32, 4096)], []
    else:
        shapes = [(8, 1024), (8, 4096), (32, 1024), (32, 4096), (32, 8192), (64, 4096), (64, 8192), (1, 2048)]
        # A LLaMA-8B-like head layout, and fp32 (exact "ieee" dots).
        extra = [
            (32, 4096, (32, 8, 128), torch.bfloat16),
            (64, 8192, (32, 8, 128), torch.bfloat16),
            (16, 2048, (9, 3, 64), torch.float32),
        ]
    cases = [(n, p, (9, 3, 64), dt) for dt in (torch.bfloat16, torch.float16) for n, p in shapes] + extra
    rows = []
    for num_ctx, prefix, heads, dtype in cases:
        rows.append(check(num_ctx, prefix, heads, dtype, dev))
        print(rows[-1], flush=True)
    out = args.out or (None if args.dry_run else default_out("attention", gpu=True))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "gpu_attention_check.json").write_text(json.dumps(rows, indent=1))
        write_manifest(out, "attention-gpu", gpu=dev.type == "cuda")
    tolerance = {"bfloat16": 2e-2, "float16": 5e-3, "float32": 1e-4}
    bad = [r for r in rows if max(r["err_triton_shared"], r["err_triton_per_ctx"]) > tolerance[r["dtype"]]]
    head = ["ctx", "prefix", "heads", "dtype", "rel err shared", "graph ms: torch per-ctx", "triton per-ctx"]
    head += ["triton shared", "shared vs torch", "shared vs triton per-ctx", "eager ms: torch per-ctx"]
    head += ["triton per-ctx", "triton shared", "shared GB/s (graph)", "MB saved"]
    print("\n| " + " | ".join(head) + " |")
    print("|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        g = [r[f"graph_ms_{n}"] for n in ("torch_per_ctx", "triton_per_ctx", "triton_shared")]
        e = [r[f"ms_{n}"] for n in ("torch_per_ctx", "triton_per_ctx", "triton_shared")]
        cells = [str(r["contexts"]), str(r["prefix"]), r["heads"], r["dtype"], f"{r['err_triton_shared']:.1e}"]
        cells += [f"{g[0]:.4f}", f"{g[1]:.4f}", f"{g[2]:.4f}", f"{g[0] / g[2]:.1f}x", f"{g[1] / g[2]:.1f}x"]
        cells += [f"{e[0]:.3f}", f"{e[1]:.3f}", f"{e[2]:.3f}", f"{r['shared_gbps']:.0f}", f"{r['kv_mb_saved']:.0f}"]
        print("| " + " | ".join(cells) + " |")
    print("all within tolerance" if not bad else f"{len(bad)} shapes OUT OF TOLERANCE")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
