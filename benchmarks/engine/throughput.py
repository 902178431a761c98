"""Engine benchmark: prefill and decode throughput of Parrot's builtin engine against transformers
and real vLLM, on the same model and dtype, in one run; results as ratios.

    python -m benchmarks.engine            # parrot + transformers (+ vLLM if installed)
    python -m benchmarks.engine --no-vllm  # skip vLLM
    python -m benchmarks.engine --quick    # fewer lengths / batch sizes

Peers run one after another (never concurrently: the machine has 2 cores), in `--rounds`
interleaved rounds (3: every peer, then every peer in reverse order, ...), each figure the median
of its rounds (every round in the JSON). Also reports bytes read per decode step against this
machine's measured memory bandwidth. Writes engine.json, engine.md and manifest.json to `--out`
(default bench_results/engine-<machine kind>, e.g. engine-amd-avx512).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Protocol

import torch

from benchmarks.common.resultset import default_out, write_manifest
from benchmarks.peers.parrot_engine import ParrotEngineProbe
from parrot.engine.config import resolve_dtype
from parrot.engine.kernels.blocks import BlockLinear, BlockLMHead
from parrot.engine.model.config import ModelConfig
from parrot.engine.model.layers import Linear
from parrot.engine.model.loader import DEFAULT_MODEL, resolve_model_folder


class Probe(Protocol):
    def measure_prefill(self, lengths: list[int]) -> dict[int, float]: ...
    def measure_decode(self, batch_sizes: list[int], new_tokens: int) -> dict[int, float]: ...


def memory_bandwidth_gbs(num_bytes: int = 512 << 20, repeats: int = 5) -> float:
    """Copy bandwidth (read + write) of a large tensor, GB/s, best of `repeats`."""
    src = torch.empty(num_bytes, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return 2 * num_bytes / best / 1e9


def decode_step_bytes(
    cfg: ModelConfig, dtype_bytes: int, batch: int, context_len: int, weight_bytes: int | None = None
) -> int:
    """Bytes one decode step must read: every weight once (`weight_bytes` where the engine reads
    them in another form, e.g. the block kernels' 4/8-bit blocks), plus each sequence's KV."""
    h, q, kv, inter = (
        cfg.hidden_size,
        cfg.num_heads * cfg.head_dim,
        cfg.num_kv_heads * cfg.head_dim,
        cfg.intermediate_size,
    )
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * inter
    if weight_bytes is None:
        weight_bytes = (cfg.num_layers * per_layer + cfg.vocab_size * h) * dtype_bytes
    kv_bytes = 2 * cfg.num_layers * kv * context_len * batch
    return weight_bytes + kv_bytes * dtype_bytes


def read_weight_bytes(model: torch.nn.Module) -> int | None:
    """What a decode step reads of the engine's projections and LM head when they run on the block
    kernels (their encodings' size), else None (the dtype's size)."""
    pieces = [m for m in model.modules() if isinstance(m, (BlockLinear, BlockLMHead))]
    if not pieces:
        return None
    encoded = sum(b.nbytes for m in pieces if (b := m.encoded.packed) is not None)
    others = [m.weight for m in model.modules() if isinstance(m, Linear) and not isinstance(m, BlockLinear)]
    return encoded + sum(w.numel() * w.element_size() for w in others)


def run_probe(name: str, probe: Probe, lengths: list[int], batches: list[int], new_tokens: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    prefill = probe.measure_prefill(lengths)
    decode = probe.measure_decode(batches, new_tokens)
    print(f"  {name}: prefill {fmt(prefill)} | decode {fmt(decode)} ({time.perf_counter() - t0:.0f}s)", flush=True)
    return {"prefill_tok_s": prefill, "decode_tok_s": decode}


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per metric and size, the median over the rounds' runs."""
    return {kind: {k: statistics.median(r[kind][k] for r in runs) for k in runs[0][kind]} for kind in runs[0]}


def fmt(d: dict[int, float]) -> str:
    return ", ".join(f"{k}:{v:.0f}" for k, v in d.items())


def main() -> None:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.engine", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every engine; medians are reported")
    ap.add_argument("--out", type=Path, help="where engine.{json,md} go (default: bench_results/engine-<machine kind>)")
    ap.add_argument("--prefill-prompts", type=int, default=3, help="prompts per prefill length, every engine")
    a = ap.parse_args()
    a.dtype = resolve_dtype(a.dtype)  # every engine in the same dtype
    a.out = a.out or default_out("engine")
    lengths = [128, 512] if a.quick else [128, 512, 2048]
    batches = [1, 8, 32] if a.quick else [1, 8, 32, 64]
    new_tokens = 16 if a.quick else 32
    folder = resolve_model_folder(DEFAULT_MODEL)
    cfg = ModelConfig.from_folder(folder)
    results: dict[str, Any] = {
        "model": DEFAULT_MODEL,
        "dtype": a.dtype,
        "machine": platform.processor() or platform.machine(),
        "threads": 2,
        "peers": {},
    }
    print(f"engine benchmark: {DEFAULT_MODEL} {a.dtype}, prefill {lengths}, decode batches {batches}", flush=True)
    with contextlib.ExitStack() as stack:
        probe = ParrotEngineProbe(str(folder), a.dtype, repeats=a.prefill_prompts)
        stack.callback(probe.close)
        results["native_kernels"] = probe.engine.native_kernels
        weight_bytes = read_weight_bytes(probe.engine.model)
        probes: dict[str, Probe] = {"parrot": probe}
        if not a.no_hf:
            from benchmarks.peers.hf_engine import HFPeer

            probes["transformers"] = HFPeer(folder, a.dtype, repeats=a.prefill_prompts)
        vllm = None  # the peer with a prefix cache: each round's prompts take a salt of their own
        if not a.no_vllm:
            try:
                from benchmarks.peers.vllm_server import VLLMPeer, vllm_server

                server = stack.enter_context(vllm_server(folder, extra_args=["--dtype", a.dtype]))
                vllm = probes["vllm"] = VLLMPeer(server, repeats=a.prefill_prompts)
            except FileNotFoundError as exc:
                print(f"  vllm: skipped ({exc})")
        # Rounds interleave the engines (every engine, then again in reverse order): a machine
        # that drifts while they run one after another would otherwise decide the ratios.
        rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in probes}
        for i in range(a.rounds):
            if vllm is not None:
                vllm.salt = f"/round{i}"  # new prompts: never a prefix-cache hit
            for name in list(probes) if i % 2 == 0 else list(reversed(probes)):
                rounds[name].append(run_probe(name, probes[name], lengths, batches, new_tokens))
        results["peers"] = {name: median_run(runs) for name, runs in rounds.items()}
        results["rounds"] = rounds
    bw = memory_bandwidth_gbs()
    dtype_bytes = 2 if a.dtype == "bfloat16" else 4
    parrot = results["peers"]["parrot"]["decode_tok_s"]
    results["memory_bandwidth_gbs"] = bw
    results["decode_bandwidth_use"] = {
        b: decode_step_bytes(cfg, dtype_bytes, b, 32 + new_tokens // 2, weight_bytes) * (tps / b) / 1e9 / bw
        for b, tps in parrot.items()
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "engine.json").write_text(json.dumps(results, indent=1))
    (a.out / "engine.md").write_text(markdown(results))
    write_manifest(a.out, "engine")
    print(markdown(results))


def markdown(r: dict[str, Any]) -> str:
    peers = r["peers"]
    others = [p for p in peers if p != "parrot"]
    head = "| metric | parrot | " + " | ".join(others) + " | " + " | ".join(f"parrot / {p}" for p in others) + " |"
    lines = [
        f"Model {r['model']}, {r['dtype']}, {r['threads']} threads, parrot's kernels: "
        f"{r.get('native_kernels', 'not recorded')}. Throughput in tokens/s.",
        "",
        head,
        "|" + "---|" * (2 + 2 * len(others)),
    ]
    for kind, label in (("prefill_tok_s", "prefill {} tokens"), ("decode_tok_s", "decode batch {}")):
        for k, v in peers["parrot"][kind].items():
            vals = [peers[p][kind].get(k) for p in others]
            cells = [f"{x:.0f}" if x else "-" for x in vals] + [f"{v / x:.2f}x" if x else "-" for x in vals]
            lines.append(f"| {label.format(k)} | {v:.0f} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        f"Memory bandwidth (copy): {r['memory_bandwidth_gbs']:.1f} GB/s. Share of it that parrot's decode "
        "step reads (weights + KV): " + ", ".join(f"batch {b}: {u:.0%}" for b, u in r["decode_bandwidth_use"].items())
    )
    return "\n".join(lines) + "\n"
