"""Shared-prefix vs per-context decode attention on this machine (a program, not a test).

    python -m benchmarks.attention_bench [--quick] [--dtype bfloat16|float32] [--out DIR]

For N contexts forked from one P-token prefix, each with its own suffix of 100-1,000 tokens (the
newest token included), one decode step of the default model (SmolLM2-135M: 30 layers, 9 query /
3 KV heads, head_dim 64) is timed two ways, side by side in one run (this machine is shared and
noisy, so only the ratios are meant to travel):
  - attention: the backend's per-step `prepare` plus `decode` of all 30 layers;
  - decode step: `prepare` plus the whole model forward over the N decode rows and the logits.
"per-context" is the engine's `PagedAttention` (each context reads all its KV); "per-context
(index_select)" is the same with its gather done by `index_select` (a stronger baseline: advanced
indexing is several times slower at gathering blocks); "shared" is `SharedPrefixAttention` (the
prefix once per step for the whole batch, then each suffix).
Bytes: the KV each path must read per step, plus the weights for the step, against this machine's
copy bandwidth. The KV cache holds random values (written, so every page is real memory).

Writes `attention_bench.json` and `attention_bench.md` (and a PNG if matplotlib is present).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from parrot.engine.attention.base import PagedAttention, SeqSpec
from parrot.engine.attention.shared_prefix_backend import SharedPrefixAttention
from parrot.engine.kv.cache import KVCache
from parrot.engine.model.llama import LlamaModel
from parrot.engine.model.loader import DEFAULT_MODEL, load_model, resolve_model_folder

BLOCK_SIZE = 16
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


class IndexSelectPagedAttention(PagedAttention):
    """The per-context path with a faster block gather: the fair baseline for the gain."""

    def decode(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        b = q.shape[0]
        ids = self.decode_tables.reshape(-1)
        keys = self.cache.k[layer].index_select(0, ids).view(b, -1, self.num_kv_heads, self.head_dim).transpose(1, 2)
        vals = self.cache.v[layer].index_select(0, ids).view(b, -1, self.num_kv_heads, self.head_dim).transpose(1, 2)
        qg = q.view(b, self.num_kv_heads, self.num_groups, self.head_dim)
        o = F.scaled_dot_product_attention(qg, keys, vals, attn_mask=self.decode_mask, scale=self.scale)
        return o.reshape(b, -1)


def build_batch(num_ctx: int, prefix_len: int, suffix_lens: list[int]) -> tuple[list[SeqSpec], torch.Tensor]:
    """Forked layout: the prefix's full blocks first, then each context's own blocks (its copy of
    the prefix's partly filled last block, then its suffix). Returns the specs and the new slots."""
    bs = BLOCK_SIZE
    shared = prefix_len // bs
    seqs, slots, next_block = [], [], shared
    for s in suffix_lens[:num_ctx]:
        seq_len = prefix_len + s
        own = -(-seq_len // bs) - shared
        table = list(range(shared)) + list(range(next_block, next_block + own))
        next_block += own
        seqs.append(SeqSpec(1, seq_len, table))
        slots.append(table[(seq_len - 1) // bs] * bs + (seq_len - 1) % bs)
    return seqs, torch.tensor(slots)


def measure(fn: Callable[[], object], min_time: float) -> float:
    """Median seconds of `fn` after one warm-up; a call slower than `min_time` is its own sample."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    if first >= min_time:
        return first
    samples: list[float] = []
    while sum(samples) < min_time and len(samples) < 7:
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


@torch.inference_mode()
def time_step(
    model: LlamaModel,
    backend: PagedAttention,
    seqs: list[SeqSpec],
    slots: torch.Tensor,
    q: torch.Tensor,
    ids: torch.Tensor,
    min_time: float,
) -> tuple[float, float]:
    """Seconds per decode step: (prepare + every layer's decode attention, prepare + model forward)."""
    positions = torch.tensor([s.seq_len - 1 for s in seqs])

    def attention() -> None:
        backend.prepare(seqs, slots)
        for layer in range(model.cfg.num_layers):
            backend.decode(layer, q)

    def step() -> None:
        backend.prepare(seqs, slots)
        model.logits(model(ids, positions, backend.forward)).argmax(-1)

    return measure(attention, min_time), measure(step, min_time)


def copy_bandwidth(dtype: torch.dtype) -> float:
    """Bytes/s of a large tensor copy (read + write), the machine's practical memory bandwidth."""
    src = torch.ones(64 << 20, dtype=torch.float32)  # 256 MB, well past the caches
    dst = torch.empty_like(src)
    t = measure(lambda: dst.copy_(src), 1.0)
    return 2 * src.numel() * src.element_size() / t


def run(args: argparse.Namespace) -> dict:
    load_before = os.getloadavg()[0]
    dtype = DTYPES[args.dtype]
    model: LlamaModel = load_model(resolve_model_folder(DEFAULT_MODEL), dtype)
    cfg = model.cfg
    hq, hkv, d, num_layers = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.num_layers
    contexts, prefixes = ([8, 32], [1024, 4096]) if args.quick else ([8, 16, 32, 64], [1024, 4096, 8192])
    rng = random.Random(0)
    suffix_lens = [rng.randint(100, 1000) for _ in range(max(contexts))]
    elt = torch.empty((), dtype=dtype).element_size()
    kv_bytes_per_token = num_layers * 2 * hkv * d * elt
    weight_bytes = sum(p.numel() for p in model.parameters()) * elt
    shared_blocks = max(prefixes) // BLOCK_SIZE
    blocks = shared_blocks + sum(-(-(max(prefixes) + s) // BLOCK_SIZE) - shared_blocks for s in suffix_lens)
    cache = KVCache(num_layers, blocks, BLOCK_SIZE, hkv, d, dtype)
    # Written, not left as calloc's zero pages: reads of untouched pages all hit one cached page.
    cache.k.normal_(generator=torch.Generator().manual_seed(1))
    cache.v.normal_(generator=torch.Generator().manual_seed(2))
    backends = {
        "per_context": PagedAttention(cache, hq, hkv, d),
        "per_context_is": IndexSelectPagedAttention(cache, hq, hkv, d),
        "shared": SharedPrefixAttention(cache, hq, hkv, d),
    }
    bandwidth = copy_bandwidth(dtype)
    print(f"copy bandwidth {bandwidth / 1e9:.1f} GB/s; {torch.get_num_threads()} threads; {args.dtype}", flush=True)
    rows = []
    gen = torch.Generator().manual_seed(0)
    for prefix_len in prefixes:
        for num_ctx in contexts:
            seqs, slots = build_batch(num_ctx, prefix_len, suffix_lens)
            q = torch.randn(num_ctx, hq, d, generator=gen).to(dtype)
            ids = torch.randint(3, cfg.vocab_size, (num_ctx,), generator=gen)
            row: dict = {
                "contexts": num_ctx,
                "prefix": prefix_len,
                "mean_suffix": sum(s.seq_len for s in seqs) / num_ctx - prefix_len,
            }
            for name, backend in backends.items():
                attn_s, step_s = time_step(model, backend, seqs, slots, q, ids, args.min_time)
                row[f"attn_ms_{name}"], row[f"step_ms_{name}"] = 1e3 * attn_s, 1e3 * step_s
            shared_backend = backends["shared"]
            assert isinstance(shared_backend, SharedPrefixAttention) and shared_backend.plan is not None
            plan = shared_backend.plan
            per_context_tokens = sum(s.seq_len for s in seqs)
            kv_tokens = {
                "per_context": per_context_tokens,
                "per_context_is": per_context_tokens,
                "shared": sum(seg.num_tokens for seg in plan.segments) + int(plan.tail_lens.sum()),
            }
            for name, tokens in kv_tokens.items():
                kv = tokens * kv_bytes_per_token
                row[f"kv_mb_{name}"] = kv / 1e6
                row[f"attn_gbps_{name}"] = kv / (row[f"attn_ms_{name}"] / 1e3) / 1e9
                row[f"step_gbps_{name}"] = (kv + weight_bytes) / (row[f"step_ms_{name}"] / 1e3) / 1e9
            for kind in ("attn", "step"):
                row[f"{kind}_speedup"] = row[f"{kind}_ms_per_context"] / row[f"{kind}_ms_shared"]
                row[f"{kind}_speedup_is"] = row[f"{kind}_ms_per_context_is"] / row[f"{kind}_ms_shared"]
            print(
                f"{num_ctx:3d} ctx x {prefix_len:5d} prefix: attention {row['attn_ms_per_context']:8.1f} "
                f"/ {row['attn_ms_per_context_is']:8.1f} -> {row['attn_ms_shared']:7.1f} ms "
                f"({row['attn_speedup']:5.1f}x / {row['attn_speedup_is']:5.1f}x); step "
                f"{row['step_ms_per_context']:8.1f} / {row['step_ms_per_context_is']:8.1f} -> "
                f"{row['step_ms_shared']:7.1f} ms ({row['step_speedup']:4.1f}x / {row['step_speedup_is']:4.1f}x)",
                flush=True,
            )
            rows.append(row)
    return {
        "machine": {
            "cpu": _cpu_name(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "copy_bandwidth_gbps": bandwidth / 1e9,
            # Other work on the machine: with more runnable threads than cores, every parallel
            # region waits for a descheduled thread, which punishes many small ops the most.
            "load_avg_1min_before_after": [load_before, os.getloadavg()[0]],
        },
        "model": DEFAULT_MODEL,
        "dtype": args.dtype,
        "block_size": BLOCK_SIZE,
        "weight_mb": weight_bytes / 1e6,
        "kv_kb_per_token": kv_bytes_per_token / 1e3,
        "rows": rows,
    }


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [
        f"# Shared-prefix vs per-context decode attention ({result['model']}, {result['dtype']})",
        "",
        f"{m['cpu']}, {m['threads']} threads, torch {m['torch']}; copy bandwidth {m['copy_bandwidth_gbps']:.1f} GB/s; "
        f"load average {m['load_avg_1min_before_after'][0]:.1f} before, "
        f"{m['load_avg_1min_before_after'][1]:.1f} after; "
        f"block size {result['block_size']}; weights {result['weight_mb']:.0f} MB; KV {result['kv_kb_per_token']:.1f} "
        "KB/token (all layers). Suffixes 100-1,000 tokens (seeded). Times are per decode step (all layers).",
        "",
        'Gain = per-context time / shared time; "is": the per-context path with an index_select gather.',
        "",
        "| contexts | prefix | mean suffix | attention ms per-ctx / per-ctx is / shared | attention gain (is) | "
        "step ms per-ctx / per-ctx is / shared | step gain (is) | KV read MB per-ctx / shared | "
        "attention GB/s per-ctx is / shared |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['contexts']} | {r['prefix']} | {r['mean_suffix']:.0f} | {r['attn_ms_per_context']:.0f} / "
            f"{r['attn_ms_per_context_is']:.0f} / {r['attn_ms_shared']:.0f} | {r['attn_speedup']:.1f}x "
            f"({r['attn_speedup_is']:.1f}x) | {r['step_ms_per_context']:.0f} / {r['step_ms_per_context_is']:.0f} / "
            f"{r['step_ms_shared']:.0f} | {r['step_speedup']:.2f}x ({r['step_speedup_is']:.2f}x) | "
            f"{r['kv_mb_per_context']:.0f} / {r['kv_mb_shared']:.0f} | {r['attn_gbps_per_context_is']:.1f} / "
            f"{r['attn_gbps_shared']:.1f} |"
        )
    target = next((r for r in result["rows"] if r["contexts"] == 32 and r["prefix"] == 4096), None)
    if target is not None:
        for label, suffix in (("engine's per-context path", ""), ("index_select per-context path", "_is")):
            attn, step = target[f"attn_speedup{suffix}"], target[f"step_speedup{suffix}"]
            ok = attn >= 5 and step >= 2
            lines.append(
                f"\nTarget at 32 contexts x 4k prefix (attention >= 5x, decode step >= 2x) vs the {label}: "
                f"{attn:.1f}x / {step:.2f}x -> {'met' if ok else 'NOT met'}."
            )
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for prefix in sorted({r["prefix"] for r in result["rows"]}):
        rows = [r for r in result["rows"] if r["prefix"] == prefix]
        for ax, key in zip(axes, ("attn_speedup", "step_speedup"), strict=True):
            ax.plot([r["contexts"] for r in rows], [r[key] for r in rows], marker="o", label=f"prefix {prefix}")
    for ax, title in zip(axes, ("attention", "decode step"), strict=True):
        ax.set(xscale="log", xlabel="contexts", ylabel="shared / per-context speedup", title=title)
        ax.set_xticks(sorted({r["contexts"] for r in result["rows"]}), labels=None)
        ax.legend()
    fig.suptitle(f"Shared-prefix attention gain ({result['dtype']}, {result['machine']['threads']} threads)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="8/32 contexts x 1k/4k prefixes only")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--min-time", type=float, default=0.5, help="seconds of repeats per measurement")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--out", type=Path, default=Path("bench_results/attention"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / "attention_bench"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    stem.with_suffix(".md").write_text(markdown(result))
    plotted = plot(result, stem.with_suffix(".png"))
    print(markdown(result))
    print(f"wrote {stem}.json, {stem}.md" + (f", {stem}.png" if plotted else ""))


if __name__ == "__main__":
    main()
