"""The paper's evaluation at full scale on the simulator: the real manager over simulated A100 /
A6000 engines on a virtual clock (parrot.sim), Parrot against the request-level baselines.

    python -m benchmarks.sim.paper            # the whole suite (~10-20 min of wall time here)
    python -m benchmarks.sim.paper --quick    # one point per figure (~2 min)
    python -m benchmarks.sim.paper --only gpts multi_agent
    python -m benchmarks.sim.paper --only gpts --keep --redo   # GPTs again, the rest kept

Writes results.json, results.md, *.png and manifest.json to `--out` (default
bench_results/sim-paper-scale): every point's metric per configuration, and the table of our
ratios against the paper's figures 11-18 (ours, paper's, difference, and the reason where it
passes 25%).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import platform
import subprocess
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.common.netsim import RttModel
from benchmarks.common.paper import load_paper_workloads
from benchmarks.common.resultset import RESULTS, write_manifest
from benchmarks.sim.cluster import CONFIGS, tokenizer_folder
from benchmarks.sim.suite import COMPARISONS, GPTS_THRESHOLD_MS, Comparison, Point, Result, points, run_point
from benchmarks.sim.words import Words
from parrot.sim import profiles
from parrot.text import Tokenizer

OUT = RESULTS / "sim-paper-scale"

# Why a ratio differs from the paper's by more than 25% (read from the runs; see README "Simulator").
REASONS = {
    "map-reduce vs latency-centric (most)": "our latency-centric baseline caps a step at 128 batched tokens, which "
    "never limits 20-53 map decodes (one token each); the paper's latency-centric vLLM also bounded the batch, so "
    "its maps ran in waves. Here the gain is the round trips and the maps' prefill in big steps.",
    "chain + background load vs vLLM (most)": "the background stream (512-token prompts, 50 outputs, <= 3.5/s) "
    "adds little load to a simulated A100 (about 5% of its decode capacity); the paper's gain with background "
    "came from its vLLM batching the chain's calls with the background's at a large batch's time per token.",
    "copilot vs vLLM with prefix sharing (most)": "the simulated vLLM reads each row's 6k-token shared prompt from "
    "memory (paged attention per sequence): decode is KV-bandwidth-bound (32 rows x 6k tokens x 0.5 MB), which "
    "Parrot's shared-prefix attention reads once. The paper's vLLM at the time shared the prompt's blocks too but "
    "its measured gain was smaller: its kernels were less bandwidth-bound than this model assumes.",
    "copilot (64) vs no sharing": "without sharing, 64 x 6k-token prompts do not fit the 7B's KV cache on an "
    "A6000 (57k tokens): requests run in waves, recomputing prompts; the paper's 2.4x was measured at fewer "
    "requests per batch.",
    "GPTs sustainable rate vs vLLM": "served in steady state (each app warm, Poisson arrivals for 30 s at "
    "1-32 req/s, 4 simulated A6000s): Parrot keeps <= 100 ms/token up to ~21 req/s, vLLM without prefix "
    "sharing (b, the paper's vLLM of 2023) up to ~2.7: 7.6x. The rest of the paper's 12x is in what a "
    "request without sharing costs: here each one computes its 1.1k-7.4k-token system prompt at the cost "
    "model's 55% MFU and holds it in a KV cache of ~57k tokens, which bounds (b) by prefill and memory; the "
    "paper's vLLM 0.2 also queued behind its waiting prompts (no chunked prefill). Today's vLLM with "
    "automatic prefix caching, (c), keeps up to ~4.8 req/s: Parrot 4.4x.",
    "GPTs sustainable rate vs w/o affinity": "without affinity (FIFO placement) Parrot keeps 100 ms/token up "
    "to ~24 req/s, with it ~21: placing an app's requests together concentrates the heavy apps (Productivity: "
    "7.4k-token prompt, 704-token outputs) on fewer engines once the cluster is near saturation, while the "
    "prefix index still shares each prompt under FIFO placement and every engine's KV cache holds all four "
    "prompts (12k tokens of ~57k). The paper's 3x came from prompts that competed for memory, which a "
    "7B on a 48 GB A6000 does not do here; below saturation affinity is 1.10-1.22x better per token (1-16 req/s).",
    "multi-agent (16 files) vs latency-centric": "the paper's latency-centric vLLM ran one request at a time per "
    "small batch; ours caps batched tokens (128), which still batches the 16 files' decodes, so it is much faster "
    "than the paper's.",
}


def ratio_of(c: Comparison, table: dict[tuple[str, str], dict[str, float]]) -> float | None:
    """baseline / Parrot at the comparison's points (the largest where there are several); for a
    sustainable rate, Parrot's highest rate under the threshold over the baseline's."""
    if c.sustainable:
        rates = {config: sustainable_rate(c, table, config) for config in ("parrot", c.baseline)}
        if rates["parrot"] is None:
            return None
        return rates["parrot"] / (rates[c.baseline] or min(float(p.split("/")[1]) for p in c.points) / 2)
    ratios = [
        table[(p, c.baseline)][c.metric] / table[(p, "parrot")][c.metric]
        for p in c.points
        if (p, "parrot") in table and (p, c.baseline) in table
    ]
    return max(ratios) if ratios else None


def past_limit(point: Point, result: Result) -> bool:
    """`result` is over its sweep's limit (`Point.stop_over`): its configuration is not run at the
    sweep's later points."""
    return point.stop_over is not None and result.metrics[point.stop_over[0]] > point.stop_over[1]


def sustainable_rate(c: Comparison, table: dict[tuple[str, str], dict[str, float]], config: str) -> float | None:
    """The request rate at which `config`'s metric crosses the threshold: interpolated between the
    last swept rate under it and the next (linear in log rate), the highest rate swept if it never
    crosses, None if it is over at the lowest. A rate not run counts as over (sim_paper stops a
    configuration's sweep once it is over)."""
    swept = sorted((float(p.split("/")[1]), table.get((p, config), {}).get(c.metric, math.inf)) for p in c.points)
    if swept[0][1] > GPTS_THRESHOLD_MS:
        return None
    for (r0, m0), (r1, m1) in itertools.pairwise(swept):
        if m1 > GPTS_THRESHOLD_MS:
            if math.isinf(m1):
                return r0
            return r0 * (r1 / r0) ** ((GPTS_THRESHOLD_MS - m0) / (m1 - m0))
    return swept[-1][0]


def difference(ours: float, low: float, high: float) -> float:
    """Relative distance of ours from the paper's range (0 inside it)."""
    if low <= ours <= high:
        return 0.0
    bound = low if ours < low else high
    return (ours - bound) / bound


def write_tables(results: list[Result], meta: dict[str, Any]) -> str:
    table = {(r.point, r.config): r.metrics for r in results}
    lines = ["# The paper's evaluation on the simulator", "", meta["about"], ""]
    lines += ["## Ours against the paper (ratio = baseline / Parrot; above 1: Parrot is better)", ""]
    lines += [
        "| figure | comparison | ours | paper | difference | within 25% | why not |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for c in COMPARISONS:
        ours = ratio_of(c, table)
        paper = f"{c.paper_low:g}x" if c.paper_low == c.paper_high else f"{c.paper_low:g}-{c.paper_high:g}x"
        if ours is None:
            lines.append(f"| {c.figure} | {c.what} | not run | {paper} | — | — | |")
            continue
        diff = difference(ours, c.paper_low, c.paper_high)
        ok = abs(diff) <= 0.25
        why = "" if ok else REASONS.get(c.what, "")
        lines.append(
            f"| {c.figure} | {c.what} | {ours:.2f}x | {paper} | {diff:+.0%} | {'yes' if ok else 'no'} | {why} |"
        )
    lines += [
        "",
        f"Sustainable rate: the highest request rate whose normalized latency stays <= {GPTS_THRESHOLD_MS:g} ms/token.",
        "",
    ]
    lines += [
        "## Every point",
        "",
        "Engine counters summed over the cluster's engines (peak KV blocks: the most on one engine); a dash: "
        "a point kept from a run that did not record them.",
        "",
        "| point | setup | configuration | metrics | virtual s | wall s | steps | prefill tokens | preemptions "
        "| peak KV blocks |",
    ]
    lines += ["|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    setups = {p.key: p.setup for p in points(load_paper_workloads(), False)} | meta.get("setups", {})
    for r in results:
        m = ", ".join(f"{k}={v:.2f}" for k, v in r.metrics.items())
        # A result merged from a run older than the counters has none: a dash, not a zero.
        n = [r.counters.get(k) for k in ("steps", "prefill_tokens", "preemptions", "peak_kv_blocks")]
        counted = " | ".join("—" if v is None else f"{v:.0f}" for v in n)
        lines.append(
            f"| {r.point} | {setups.get(r.point, '')} | {CONFIGS[r.config].label} | {m} | {r.virtual_s:.1f} | "
            f"{r.wall_s:.1f} | {counted} |"
        )
    lines += ["", "## Setups", ""]
    for name in ("a100-13b", "a6000-7b"):
        s = profiles.setup(name)
        lines.append(
            f"- **{name}**: {s.about}; {s.hardware.about}; {s.model.about}; {s.num_blocks} KV blocks of "
            f"{s.block_size} tokens; step budget {s.max_num_batched_tokens} tokens, "
            f"{s.latency_max_batched_tokens} while latency work decodes"
        )
    lines += ["", "## Configurations", ""]
    for cfg in CONFIGS.values():
        client = "SDK, whole DAG per submission" if cfg.parrot else "request-level client, a round trip per call"
        lines.append(
            f"- **{cfg.label}** (`{cfg.key}`): {client}; policy {cfg.policy}; prefix sharing "
            f"{'on' if cfg.prefix_sharing else 'off'}; engine latency cap {'on' if cfg.latency_cap else 'off'}; "
            f"{'shared-prefix' if cfg.shared_prefix_attention else 'paged'} attention"
        )
    return "\n".join(lines) + "\n"


def plot(results: list[Result], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = {
        "gpts": "norm_latency_ms",
        "many_chains": "mean_jct_s",
        "multi_agent": "jct_s",
        "copilot": "mean_latency_s",
        "map_reduce": "jct_s",
    }
    written = []
    by_point = {p.key: p for p in points(load_paper_workloads(), False)}
    for prefix, metric in figures.items():
        rows = [r for r in results if r.point.startswith(prefix + "/") and r.point in by_point]
        if not rows:
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        for config in dict.fromkeys(r.config for r in rows):
            xs = [(by_point[r.point].x, r.metrics[metric]) for r in rows if r.config == config]
            xs.sort()
            ax.plot([x for x, _ in xs], [y for _, y in xs], marker="o", label=CONFIGS[config].label)
        ax.set_title(f"{by_point[rows[0].point].figure} (simulated)")
        ax.set_ylabel(metric)
        ax.set_yscale("log" if prefix in ("gpts", "multi_agent") else "linear")
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"{prefix}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path.name)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one point per figure")
    parser.add_argument("--only", nargs="*", default=None, help="workload prefixes (chain, gpts, ...)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--keep", action="store_true", help="keep the points results.json has; run the others")
    parser.add_argument("--table-only", action="store_true", help="write the table and plots from results.json")
    parser.add_argument("--redo", action="store_true", help="with --keep: run the --only points again")
    args = parser.parse_args()
    pw = load_paper_workloads()
    rtt = RttModel.from_workloads(pw)
    words = Words(Tokenizer(tokenizer_folder()))
    todo = [p for p in points(pw, args.quick) if not args.only or any(p.key.startswith(o) for o in args.only)]
    results: list[Result] = []
    saved = args.out / "results.json"
    saved_meta: dict[str, Any] = {}
    if (args.keep or args.table_only) and saved.exists():
        loaded = json.loads(saved.read_text())
        results = [Result(**r) for r in loaded["results"]]
        saved_meta = loaded.get("meta") or {}
    if args.redo:
        results = [r for r in results if r.point not in {p.key for p in todo}]
    done = {(r.point, r.config) for r in results}
    over: set[tuple[str, str]] = set()  # (figure, configuration) past its sweep's limit: not run further
    args.out.mkdir(parents=True, exist_ok=True)
    for point in [] if args.table_only else todo:
        for config in point.configs:
            if (point.key, config) in done:
                continue
            if point.stop_over is not None and (point.figure, config) in over:
                metric, limit = point.stop_over
                print(f"{point.key:22} {config:13} not run: {metric} over {limit:g} at an earlier point")
                continue
            result = run_point(point, config, rtt, words)
            results.append(result)
            saved.write_text(json.dumps({"meta": {}, "results": [asdict(r) for r in results]}, indent=1))
            if past_limit(point, result):
                over.add((point.figure, config))
            took = f"virtual {result.virtual_s:.1f} s, wall {result.wall_s:.1f} s"
            print(f"{point.key:22} {config:13} {result.metrics}  {took}", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    if args.table_only:  # the results are a past run's: its commit, not the one that redraws them
        commit = saved_meta.get("commit", commit)
    wall = sum(r.wall_s for r in results)
    serving_h = sum(r.virtual_s for r in results) / 3600
    about = (
        f"Commit {commit}, {platform.processor() or platform.machine()}; simulated on a virtual clock: "
        f"{serving_h:.1f} h of serving in {wall / 60:.1f} min of wall time. Same RTT draws per configuration; "
        "Parrot's apps are submitted whole through the manager's API, the baselines' calls one by one as plain "
        "prompts."
    )
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"about": about, "wall_s": wall, "commit": commit, "setups": {p.key: p.setup for p in todo}}
    (args.out / "results.json").write_text(
        json.dumps({"meta": meta, "results": [asdict(r) for r in results]}, indent=1)
    )
    (args.out / "results.md").write_text(write_tables(results, meta))
    if not args.table_only:
        write_manifest(args.out, "sim-paper")
    print("plots:", plot(results, args.out))
    print((args.out / "results.md").read_text().split("## Every point")[0])


if __name__ == "__main__":
    main()
