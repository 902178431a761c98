"""Shared-prefix vs per-context decode attention on this machine (a program, not a test).

    python -m benchmarks.attention.shared_prefix [--quick] [--dtype bfloat16|float32] [--threads N] [--out DIR]

For N contexts forked from one P-token prefix, each with its own suffix of 100-1,000 tokens (the
newest token included), one decode step of the default model (SmolLM2-135M: 30 layers, 9 query /
3 KV heads, head_dim 64) is timed two ways, side by side in one run (this machine is shared and
noisy, so only the ratios are meant to travel):
  - attention: the backend's per-step `prepare` plus `decode` of all 30 layers;
  - decode step: `prepare` plus the whole model forward over the N decode rows and the logits.
"per-context" is the engine's first per-context decode (advanced-indexing gathers into fresh
buffers per layer, boolean mask); "tuned" is today's engine `PagedAttention`: the native
per-context kernel where the native kernels run (bf16 on an AVX512-BF16 CPU; the model then gets
the native transform too, as in the engine), else block gathers by `index_select` into buffers
reused by every layer and an additive mask: the stronger baseline; "shared" is
`SharedPrefixAttention` (the prefix once per step for the whole batch, then each suffix; the native
cascade kernel where the native kernels run, else torch ops). Each figure is
the fastest of `--rounds` rounds that alternate the paths (other work on a shared
machine only ever adds time; the first round warms allocators and caches); within a round, short
calls repeat for `--min-time` seconds.
Bytes: the KV each path must read per step (plus the weights, for the step) over its time, next
to this machine's copy bandwidth. The KV cache holds random values (written: every page is real).

Writes attention_bench.json, attention_bench.md (and a PNG if matplotlib is present) and
manifest.json to `--out` (default bench_results/attention-shared-prefix-<machine kind>).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.common.resultset import default_out, write_manifest
from parrot.engine import kernels
from parrot.engine.attention.base import PagedAttention, SeqSpec
from parrot.engine.attention.shared_prefix_backend import SharedPrefixAttention
from parrot.engine.kv.cache import KVCache
from parrot.engine.model.llama import LlamaModel
from parrot.engine.model.loader import DEFAULT_MODEL, load_model, resolve_model_folder

BLOCK_SIZE = 16
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
PATHS = ("per_context", "tuned", "shared")


class PerContextV1(PagedAttention):
    """The engine's first per-context decode (kept here as a reference point): blocks gathered by
    advanced indexing into fresh buffers per layer, a boolean mask."""

    def prepare_decode(self, seqs: list[SeqSpec]) -> None:
        super().prepare_decode(seqs)
        if seqs:  # its own boolean mask (the engine's path may be the native kernel, which needs none)
            slots = torch.arange(self.decode_tables.shape[1] * self.cache.block_size)
            self.decode_mask = (slots[None, :] < self.decode_lens[:, None])[:, None, None, :]

    def decode(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        b, hkv, d = q.shape[0], self.num_kv_heads, self.head_dim
        keys = self.cache.k[layer][self.decode_tables].flatten(1, 2).transpose(1, 2)
        vals = self.cache.v[layer][self.decode_tables].flatten(1, 2).transpose(1, 2)
        qg = q.view(b, hkv, self.num_groups, d)
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
    """Fastest seconds of `fn` over repeats filling `min_time` (at least one call, at most 10)."""
    samples: list[float] = []
    while (sum(samples) < min_time and len(samples) < 10) or not samples:
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return min(samples)


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
    # 8k prefixes plus suffixes pass the model's 8,192 positions: clamp the RoPE lookup (the values
    # are random anyway; the cost of every op is the same).
    positions = torch.tensor([s.seq_len - 1 for s in seqs]).clamp(max=model.cfg.max_position_embeddings - 1)

    def attention() -> None:
        backend.prepare(seqs, slots)
        for layer in range(model.cfg.num_layers):
            backend.decode(layer, q)

    def step() -> None:
        backend.prepare(seqs, slots)
        model.logits(model(ids, positions, backend.forward)).argmax(-1)

    return measure(attention, min_time), measure(step, min_time)


def copy_bandwidth() -> float:
    """Bytes/s of a large tensor copy (read + write), the machine's practical memory bandwidth."""
    src = torch.ones(64 << 20, dtype=torch.float32)  # 256 MB, well past the caches
    dst = torch.empty_like(src)
    t = measure(lambda: dst.copy_(src), 1.0)
    return 2 * src.numel() * src.element_size() / t


def run(args: argparse.Namespace) -> dict:
    load_before = os.getloadavg()[0]
    dtype = DTYPES[args.dtype]
    model: LlamaModel = load_model(resolve_model_folder(DEFAULT_MODEL), dtype)
    native = kernels.apply_native(model)  # as the default engine does (torch ops where unavailable)
    cfg = model.cfg
    hq, hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    contexts, prefixes = ([8, 32], [1024, 4096]) if args.quick else ([8, 16, 32, 64], [1024, 4096, 8192])
    rng = random.Random(0)
    suffix_lens = [rng.randint(100, 1000) for _ in range(max(contexts))]
    elt = torch.empty((), dtype=dtype).element_size()
    kv_bytes_per_token = cfg.num_layers * 2 * hkv * d * elt
    weight_bytes = sum(p.numel() for p in model.parameters()) * elt
    shared_blocks = max(prefixes) // BLOCK_SIZE
    blocks = shared_blocks + sum(-(-(max(prefixes) + s) // BLOCK_SIZE) - shared_blocks for s in suffix_lens)
    cache = KVCache(cfg.num_layers, blocks, BLOCK_SIZE, hkv, d, dtype)
    # Written, not left as calloc's zero pages: reads of untouched pages all hit one cached page.
    cache.k.normal_(generator=torch.Generator().manual_seed(1))
    cache.v.normal_(generator=torch.Generator().manual_seed(2))
    shared_backend = SharedPrefixAttention(cache, hq, hkv, d, native.applied)
    backends: dict[str, PagedAttention] = {
        "per_context": PerContextV1(cache, hq, hkv, d, native.applied),
        "tuned": PagedAttention(cache, hq, hkv, d, native.applied),
        "shared": shared_backend,
    }
    bandwidth = copy_bandwidth()
    print(f"copy bandwidth {bandwidth / 1e9:.1f} GB/s; {torch.get_num_threads()} threads; {args.dtype}", flush=True)
    rows = []
    gen = torch.Generator().manual_seed(0)
    for prefix_len in prefixes:
        for num_ctx in contexts:
            seqs, slots = build_batch(num_ctx, prefix_len, suffix_lens)
            q = torch.randn(num_ctx, hq, d, generator=gen).to(dtype)
            ids = torch.randint(3, cfg.vocab_size, (num_ctx,), generator=gen)
            mean_suffix = sum(s.seq_len for s in seqs) / num_ctx - prefix_len
            row: dict = {"contexts": num_ctx, "prefix": prefix_len, "mean_suffix": mean_suffix}
            best = {f"{kind}_ms_{name}": float("inf") for kind in ("attn", "step") for name in PATHS}
            for _ in range(args.rounds):
                for name in PATHS:
                    attn_s, step_s = time_step(model, backends[name], seqs, slots, q, ids, args.min_time)
                    best[f"attn_ms_{name}"] = min(best[f"attn_ms_{name}"], 1e3 * attn_s)
                    best[f"step_ms_{name}"] = min(best[f"step_ms_{name}"], 1e3 * step_s)
            row |= best
            plan = shared_backend.plan
            assert plan is not None, "the shared path fell back to per-context"
            per_context_tokens = sum(s.seq_len for s in seqs)
            kv_tokens = {
                "per_context": per_context_tokens,
                "tuned": per_context_tokens,
                "shared": sum(seg.num_tokens for seg in plan.segments) + int(plan.tail_lens.sum()),
            }
            for name, tokens in kv_tokens.items():
                kv = tokens * kv_bytes_per_token
                row[f"kv_mb_{name}"] = kv / 1e6
                row[f"attn_gbps_{name}"] = kv / row[f"attn_ms_{name}"] / 1e6
                row[f"step_gbps_{name}"] = (kv + weight_bytes) / row[f"step_ms_{name}"] / 1e6
            for kind in ("attn", "step"):
                row[f"{kind}_speedup"] = row[f"{kind}_ms_per_context"] / row[f"{kind}_ms_shared"]
                row[f"{kind}_speedup_tuned"] = row[f"{kind}_ms_tuned"] / row[f"{kind}_ms_shared"]
            print(
                f"{num_ctx:3d} ctx x {prefix_len:5d} prefix: attention {row['attn_ms_per_context']:7.0f} / "
                f"{row['attn_ms_tuned']:6.0f} -> {row['attn_ms_shared']:5.0f} ms ({row['attn_speedup']:4.1f}x / "
                f"{row['attn_speedup_tuned']:4.1f}x); step {row['step_ms_per_context']:7.0f} / "
                f"{row['step_ms_tuned']:6.0f} -> {row['step_ms_shared']:5.0f} ms ({row['step_speedup']:4.1f}x / "
                f"{row['step_speedup_tuned']:4.1f}x)",
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
        "native_kernels": native.status,
        "block_size": BLOCK_SIZE,
        "rounds": args.rounds,
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
    load = m["load_avg_1min_before_after"]
    lines = [
        f"# Shared-prefix vs per-context decode attention ({result['model']}, {result['dtype']})",
        "",
        f"{m['cpu']}, {m['threads']} threads, torch {m['torch']}; copy bandwidth {m['copy_bandwidth_gbps']:.1f} GB/s; "
        f"load average {load[0]:.1f} before, {load[1]:.1f} after; block size {result['block_size']}; weights "
        f"{result['weight_mb']:.0f} MB; KV {result['kv_kb_per_token']:.1f} KB/token (all layers). Suffixes "
        f"100-1,000 tokens (seeded). Times per decode step (all layers), fastest of {result['rounds']} rounds.",
        "",
        "Gain = per-context time / shared time, against the first per-context path and (in brackets) "
        "today's engine path, the tuned one. GB/s: the KV bytes each path must read (attention), "
        "or the KV plus the weights (step), over its time.",
        "",
        "| contexts | prefix | mean suffix | attention ms per-ctx / tuned / shared | attention gain (tuned) | "
        "step ms per-ctx / tuned / shared | step gain (tuned) | KV MB read per-ctx / shared | attention GB/s "
        "tuned / shared | step GB/s tuned / shared |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['contexts']} | {r['prefix']} | {r['mean_suffix']:.0f} | {r['attn_ms_per_context']:.0f} / "
            f"{r['attn_ms_tuned']:.0f} / {r['attn_ms_shared']:.0f} | {r['attn_speedup']:.1f}x "
            f"({r['attn_speedup_tuned']:.1f}x) | {r['step_ms_per_context']:.0f} / {r['step_ms_tuned']:.0f} / "
            f"{r['step_ms_shared']:.0f} | {r['step_speedup']:.2f}x ({r['step_speedup_tuned']:.2f}x) | "
            f"{r['kv_mb_per_context']:.0f} / {r['kv_mb_shared']:.0f} | {r['attn_gbps_tuned']:.1f} / "
            f"{r['attn_gbps_shared']:.1f} | {r['step_gbps_tuned']:.1f} / {r['step_gbps_shared']:.1f} |"
        )
    target = next((r for r in result["rows"] if r["contexts"] == 32 and r["prefix"] == 4096), None)
    if target is not None:
        for label, key in (("the first per-context path", ""), ("today's engine per-context path (tuned)", "_tuned")):
            attn, step = target[f"attn_speedup{key}"], target[f"step_speedup{key}"]
            verdict = "met" if attn >= 5 and step >= 2 else "NOT met"
            target_line = f"Target at 32 contexts x 4k prefix (attention >= 5x, step >= 2x) vs {label}: "
            lines += ["", f"{target_line}{attn:.1f}x / {step:.2f}x, {verdict}."]
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> bool:
    try:
        import matplotlib
        import matplotlib.ticker

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for prefix in sorted({r["prefix"] for r in result["rows"]}):
        rows = [r for r in result["rows"] if r["prefix"] == prefix]
        for ax, key in zip(axes, ("attn_speedup", "step_speedup"), strict=True):
            line = ax.plot([r["contexts"] for r in rows], [r[key] for r in rows], marker="o", label=f"prefix {prefix}")
            tuned = [r[key + "_tuned"] for r in rows]
            style = {"marker": "x", "linestyle": "--", "color": line[0].get_color()}
            ax.plot([r["contexts"] for r in rows], tuned, **style, label=f"prefix {prefix} vs tuned")
    ticks = sorted({r["contexts"] for r in result["rows"]})
    for ax, title in zip(axes, ("attention", "decode step"), strict=True):
        ax.set(xscale="log", xlabel="contexts", ylabel="per-context time / shared time", title=title)
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.legend(fontsize="small")
    fig.suptitle(f"Shared-prefix attention gain ({result['dtype']}, {result['machine']['threads']} threads)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="8/32 contexts x 1k/4k prefixes only")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds per shape (default 2)")
    parser.add_argument("--min-time", type=float, default=0.3, help="seconds of repeats per measurement and round")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--out", type=Path, help="default: bench_results/attention-shared-prefix-<machine kind>")
    args = parser.parse_args()
    args.out = args.out or default_out("attention-shared-prefix")
    args.rounds = args.rounds or 2
    if args.threads:
        torch.set_num_threads(args.threads)
    result = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / "attention_bench"
    stem.with_suffix(".json").write_text(json.dumps(result, indent=1))
    stem.with_suffix(".md").write_text(markdown(result))
    plotted = plot(result, stem.with_suffix(".png"))
    write_manifest(args.out, "attention-shared-prefix")
    print(markdown(result))
    print(f"wrote {stem}.json, {stem}.md" + (f", {stem}.png" if plotted else ""))


if __name__ == "__main__":
    main()
