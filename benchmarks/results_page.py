"""docs/results.md from the result sets kept in bench_results/ (`make results`).

Each folder of bench_results/ is one result set: the files one benchmark wrote on one kind of
machine, and its manifest.json (benchmark, command, commit, date, machine). This module renders
every set with its benchmark's renderer, writes the page, and rewrites README.md's headline table
(between its two markers) from the same data. Everything here is a pure function of the files, so
tests/test_results_page.py can check that the committed page and README are what the data gives.

    python -m benchmarks.results_page            # rewrite docs/results.md and the README's table
    python -m benchmarks.results_page --check    # exit 1 if either differs from the data
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.apps.paired import collect
from benchmarks.apps.paired import render as render_pairs
from benchmarks.apps.report import markdown, ratio, render_table, value

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench_results"
PAGE = ROOT / "docs" / "results.md"
README = ROOT / "README.md"
HEADLINE_START = "<!-- headline:start (make results) -->"
HEADLINE_END = "<!-- headline:end -->"

KINDS = {
    "amd-avx512": "AMD EPYC with AVX512-BF16, no AMX",
    "intel-amx": "Intel Xeon with AMX",
    "amd-avx2": "AMD EPYC with AVX2 only",
    "intel-xeon": "Intel Xeon (CPU flags not recorded)",
    "gpu-h200": "NVIDIA H200",
    "virtual-clock": "simulated engines on a virtual clock",
    "several": "several machines (one file each)",
}
# The machine kinds of the headline table, in its column order.
HEADLINE_KINDS = ("amd-avx512", "intel-amx", "amd-avx2")


@dataclass(frozen=True)
class ResultSet:
    """One folder of bench_results/: its files and what its manifest says about them."""

    path: Path
    manifest: dict[str, Any]

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def benchmark(self) -> str:
        return str(self.manifest["benchmark"])

    @property
    def kind(self) -> str:
        return str(self.manifest["machine"]["kind"])

    def json(self, name: str) -> Any:
        return json.loads((self.path / name).read_text())


def load_sets(root: Path = RESULTS) -> list[ResultSet]:
    """Every result set under `root`, by name; a folder without a manifest is an error (every kept
    set says how it was measured)."""
    sets = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and p.name != "tmp"):
        manifest = folder / "manifest.json"
        if not manifest.is_file():
            raise SystemExit(f"{folder}: no manifest.json (benchmark, command, commit, date, machine)")
        sets.append(ResultSet(folder, json.loads(manifest.read_text())))
    return sets


def machine_line(m: dict[str, Any]) -> str:
    parts = [KINDS.get(m["kind"], m["kind"])]
    if m.get("gpu"):
        parts.append(str(m["gpu"]))
    if m.get("cpu"):
        parts.append(str(m["cpu"]))
    if m.get("cpu_features"):
        parts.append("flags " + " ".join(m["cpu_features"]))
    if m.get("num_cpus"):
        parts.append(f"{m['num_cpus']} cores")
    if m.get("torch"):
        parts.append(f"torch {m['torch']}")
    return ", ".join(parts)


def set_header(s: ResultSet) -> str:
    m = s.manifest
    return "\n".join(
        [
            f"### `{s.name}`",
            "",
            f"- command: `{m['command']}`",
            f"- commit: `{m['commit']}`, measured {m['date']}",
            f"- machine: {machine_line(m['machine'])}",
            f"- files: [bench_results/{s.name}/](../bench_results/{s.name}/)",
        ]
    )


# --- renderers: one per benchmark, each a pure function of a set's files --------------------------------


def render_apps(s: ResultSet) -> str:
    results = s.json("results.json")
    return (
        "Times are medians of interleaved repeats (range in brackets); ratios are baseline / Parrot "
        "(above 1: Parrot is faster), rates Parrot / baseline.\n\n" + render_table(results)
    )


def render_paired(s: ResultSet) -> str:
    runs = [s.json(p.name) for p in sorted(s.path.glob("run-*.json"))]
    pairs = collect(runs, "d", "parrot_vllm", None)
    return (
        f"{len(runs)} runs pooled, each repeat a pair run back to back: (d) vLLM against Parrot over the "
        "same vLLM server. Above 1.0: Parrot+vLLM did better; `vLLM ITL` is vLLM's own inter-token "
        "latency ratio in the pair and `rest` what it leaves unexplained (the path through the manager).\n\n"
        + render_pairs(pairs, "d", "parrot_vllm")
    )


def engine_ratios(r: dict[str, Any], peer: str = "vllm") -> dict[str, dict[str, float]]:
    """Parrot / peer throughput per prefill length and decode batch."""
    parrot, other = r["peers"]["parrot"], r["peers"][peer]
    return {
        kind: {k: v / other[kind][k] for k, v in parrot[kind].items() if other[kind].get(k)}
        for kind in ("prefill_tok_s", "decode_tok_s")
    }


def render_engine(s: ResultSet) -> str:
    r = s.json("engine.json")
    peers = [p for p in r["peers"] if p != "parrot"]
    rows = [["metric", "Parrot (tokens/s)", *(f"{p} (tokens/s)" for p in peers), *(f"Parrot / {p}" for p in peers)]]
    rows.append(["---"] * len(rows[0]))
    for kind, label in (("prefill_tok_s", "prefill {} tokens"), ("decode_tok_s", "decode, batch {}")):
        for k, v in r["peers"]["parrot"][kind].items():
            others = [r["peers"][p][kind].get(k) for p in peers]
            rows.append(
                [
                    label.format(k),
                    f"{v:.0f}",
                    *(f"{x:.0f}" if x else "—" for x in others),
                    *(f"{v / x:.2f}x" if x else "—" for x in others),
                ]
            )
    use = ", ".join(f"batch {b}: {u:.0%}" for b, u in r["decode_bandwidth_use"].items())
    return (
        f"Model {r['model']} in {r['dtype']}, {r['threads']} threads, native kernels {r.get('native_kernels')}; "
        f"medians of {len(r['rounds']['parrot'])} interleaved rounds.\n\n{markdown(rows)}\n"
        f"Memory bandwidth (copy) {r['memory_bandwidth_gbs']:.1f} GB/s; share of it Parrot's decode step reads "
        f"(weights + KV): {use}.\n"
    )


def render_prefill_attention(s: ResultSet) -> str:
    r = s.json("prefill_attention.json")
    rows = [["new tokens", "sequence", "chunk kernel (ms)", "row by row (ms)", "torch SDPA (ms)"]]
    rows.append(["---:"] * 5)
    for row in r["rows"]:
        ms = row["ms"]
        rows.append(
            [
                str(row["new"]),
                str(row["tokens"]),
                f"{ms['chunk']:.2f}",
                f"{ms['per row']:.2f} ({ms['per row'] / ms['chunk']:.2f}x)",
                f"{ms['sdpa']:.2f} ({ms['sdpa'] / ms['chunk']:.2f}x)",
            ]
        )
    return (
        f"Causal attention of one prompt chunk over its paged KV, one layer (9 query / 3 KV heads of 64), "
        f"kernels `{r['kernels']}`; in brackets the time against the chunk kernel's.\n\n{markdown(rows)}"
    )


def render_shared_prefix(s: ResultSet) -> str:
    r = s.json("attention_bench.json")
    rows = [["contexts", "shared prefix", "mean suffix", "attention: per context / shared"]]
    rows[0].append("step: per context / shared")
    rows.append(["---:"] * 5)
    for row in r["rows"]:
        rows.append(
            [
                str(row["contexts"]),
                str(row["prefix"]),
                f"{row['mean_suffix']:.0f}",
                f"{row['attn_speedup_tuned']:.2f}x",
                f"{row['step_speedup_tuned']:.2f}x",
            ]
        )
    return (
        f"Decode steps of {r['model']} ({r['dtype']}) whose contexts fork one prompt: the shared-prefix "
        "kernel (each prefix read once for all its rows) against the native per-context kernel.\n\n" + markdown(rows)
    )


def render_gpu_attention(s: ResultSet) -> str:
    shapes = s.json("gpu_attention_check.json") + s.json("sweep/gpu_attention_check.json")
    rows = [["heads (query/KV x dim)", "contexts", "prefix", "dtype", "shared KV saved (MB)"]]
    rows[0] += ["Triton shared / per context", "max error"]
    rows.append(["---", "---:", "---:", "---", "---:", "---:", "---:"])
    for r in sorted(shapes, key=lambda r: (r["heads"], r["dtype"], r["contexts"], r["prefix"])):
        saved = r["kv_mb_per_ctx"] - r["kv_mb_shared"]
        gain = r["graph_ms_triton_per_ctx"] / r["graph_ms_triton_shared"]
        err = max(r["err_triton_per_ctx"], r["err_triton_shared"])
        cells = [r["heads"], str(r["contexts"]), str(r["prefix"]), r["dtype"], f"{saved:.0f}", f"{gain:.2f}x"]
        rows.append([*cells, f"{err:.1e}"])
    return (
        "Triton decode attention (CUDA graphs), the shared-prefix kernel against the per-context one, and "
        "the largest error against a float32 torch reference. The shared-prefix backend groups a prefix only "
        "where it spares at least 48 MB of K/V reads per layer (the break-even point of these shapes).\n\n"
        + markdown(rows)
    )


def render_sim_paper(s: ResultSet) -> str:
    from benchmarks.sim.paper import difference, ratio_of
    from benchmarks.sim.suite import COMPARISONS

    r = s.json("results.json")
    table = {(x["point"], x["config"]): x["metrics"] for x in r["results"]}
    rows = [["figure", "comparison", "ours", "paper", "within 25%"], ["---", "---", "---:", "---:", "---"]]
    for c in COMPARISONS:
        ours = ratio_of(c, table)
        paper = f"{c.paper_low:g}x" if c.paper_low == c.paper_high else f"{c.paper_low:g}-{c.paper_high:g}x"
        if ours is None:
            continue
        ok = abs(difference(ours, c.paper_low, c.paper_high)) <= 0.25
        rows.append([c.figure, c.what, f"{ours:.2f}x", paper, "yes" if ok else "no"])
    return (
        "The paper's evaluation (figures 11-18) at its scale: the real manager over simulated A100 / A6000 "
        "engines on a virtual clock; ratio = baseline / Parrot. Where a ratio is off the paper's by more "
        f"than 25%, [results.md](../bench_results/{s.name}/results.md) says why.\n\n" + markdown(rows)
    )


def render_sim_scale(s: ResultSet) -> str:
    rows = [["engines", "applications", "calls", "manager step per dispatched call (ms)", "plan per dispatch (ms)"]]
    rows[0] += ["KB per application", "collector share of wall", "longest collector pause (ms)"]
    rows.append(["---:"] * len(rows[0]))
    for r in s.json("results.json"):
        rows.append(
            [
                str(r["engines"]),
                str(r["apps"]),
                str(r["calls"]),
                f"{r['sched_ms_per_dispatch']:.3f}",
                f"{r['plan_ms_per_dispatch']:.3f}",
                f"{r['kb_per_app']:.1f}",
                f"{r['gc_share']:.0%}",
                f"{r['gc_pause_ms_max']:.0f}",
            ]
        )
    return "The manager's own cost over simulated engines (wall time of the real manager code).\n\n" + markdown(rows)


def render_sim_vs_cpu(s: ResultSet) -> str:
    rows = [["machine", "workloads x configurations", "within 20%", "median abs. error", "largest error"]]
    rows.append(["---", "---:", "---:", "---:", "---:"])
    for kind in HEADLINE_KINDS:
        path = s.path / f"{kind}.json"
        if not path.is_file():
            continue
        errors = [sim / real - 1 for _, _, _, sim, real in json.loads(path.read_text())["rows"] if real]
        rows.append(
            [
                KINDS[kind],
                str(len(errors)),
                str(sum(abs(e) <= 0.2 for e in errors)),
                f"{statistics.median(abs(e) for e in errors):.0%}",
                f"{max(errors, key=abs):+.0%}",
            ]
        )
    return (
        "The simulator's CPU profiles against the real application benchmark they were fitted to: each "
        "workload and configuration's simulated metric against the measured median. Per machine: "
        f"[{', '.join(f'{k}.md' for k in HEADLINE_KINDS)}](../bench_results/{s.name}/).\n\n" + markdown(rows)
    )


RENDERERS: dict[str, Callable[[ResultSet], str]] = {
    "apps": render_apps,
    "apps-vllm": render_apps,
    "apps-vllm-paired": render_paired,
    "engine": render_engine,
    "attention-prefill": render_prefill_attention,
    "attention-shared-prefix": render_shared_prefix,
    "attention-gpu": render_gpu_attention,
    "sim-paper": render_sim_paper,
    "sim-scale": render_sim_scale,
    "sim-vs-cpu": render_sim_vs_cpu,
}

SECTIONS = (
    ("Applications: Parrot against request-level serving", ("apps-vllm", "apps")),
    ("Parrot over vLLM against vLLM alone, pair by pair", ("apps-vllm-paired",)),
    ("Engine against vLLM", ("engine",)),
    ("Attention kernels", ("attention-prefill", "attention-shared-prefix", "attention-gpu")),
    ("Simulator", ("sim-paper", "sim-scale", "sim-vs-cpu")),
)


# --- the headline table ---------------------------------------------------------------------------------


def span(values: list[float]) -> str:
    return "—" if not values else f"{min(values):.2f}x" if len(values) == 1 else f"{min(values):.2f}-{max(values):.2f}x"


def app_ratios(results: dict[str, Any], baseline: str, config: str) -> list[float]:
    """baseline / config (times) or config / baseline (rates) for every scenario metric both ran."""
    out = []
    for sc in results["scenarios"]:
        for m in sc["metrics"]:
            r = ratio(
                value(results, sc["key"], baseline, m["key"]),
                value(results, sc["key"], config, m["key"]),
                m["lower_is_better"],
            )
            if r is not None:
                out.append(r)
    return out


def headline(sets: list[ResultSet]) -> str:
    by = {(s.benchmark, s.kind): s for s in sets}
    rows = [["", *(KINDS[k] for k in HEADLINE_KINDS)], ["---", *("---:" for _ in HEADLINE_KINDS)]]

    def cells(fn: Callable[[ResultSet], list[float]], benchmark: str) -> list[str]:
        return [span(fn(by[(benchmark, k)])) if (benchmark, k) in by else "—" for k in HEADLINE_KINDS]

    def engine(kind: str) -> Callable[[ResultSet], list[float]]:
        return lambda s: list(engine_ratios(s.json("engine.json"))[kind].values())

    def apps(baseline: str, config: str) -> Callable[[ResultSet], list[float]]:
        return lambda s: app_ratios(s.json("results.json"), baseline, config)

    rows.append(["engine: prefill 128-2,048 tokens, Parrot / vLLM", *cells(engine("prefill_tok_s"), "engine")])
    rows.append(["engine: decode batch 1-64, Parrot / vLLM", *cells(engine("decode_tok_s"), "engine")])
    rows.append(["apps: vLLM / Parrot (builtin engine)", *cells(apps("d", "parrot"), "apps-vllm")])
    rows.append(["apps: vLLM / Parrot over the same vLLM", *cells(apps("d", "parrot_vllm"), "apps-vllm")])
    rows.append(["apps: latency-centric baseline (a) / Parrot", *cells(apps("a", "parrot"), "apps-vllm")])
    return markdown(rows)


# --- the page -------------------------------------------------------------------------------------------


def render_page(sets: list[ResultSet]) -> str:
    known = {b for _, benchmarks in SECTIONS for b in benchmarks}
    unknown = sorted({s.benchmark for s in sets} - known)
    if unknown:
        raise SystemExit(f"no renderer for benchmark(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    out = [
        "# Results",
        "",
        "Generated by `make results` (`python -m benchmarks.results_page`) from the result sets in "
        "[bench_results/](../bench_results/): one folder per benchmark and machine kind, each with the "
        "command, commit, date and machine it was measured on (`manifest.json`). Do not edit this page; "
        "run a benchmark (see [benchmarks/README.md](../benchmarks/README.md)), replace its set, and "
        "regenerate. Every ratio compares configurations measured side by side in one run on one machine "
        "(the machines are shared and noisy: absolute times from different runs are not comparable).",
        "",
        "## Headline",
        "",
        "Ranges over every row of each table below; above 1.0 Parrot is faster.",
        "",
        headline(sets),
    ]
    for title, benchmarks in SECTIONS:
        chosen = [s for s in sets if s.benchmark in benchmarks]
        if not chosen:
            continue
        out += [f"## {title}", ""]
        for s in sorted(chosen, key=lambda s: (benchmarks.index(s.benchmark), s.name)):
            out += [set_header(s), "", RENDERERS[s.benchmark](s).rstrip("\n"), ""]
    return "\n".join(out).rstrip("\n") + "\n"


def with_headline(readme: str, table: str) -> str:
    """README text with the block between the headline markers replaced by `table`."""
    start, end = readme.find(HEADLINE_START), readme.find(HEADLINE_END)
    if start < 0 or end < start:
        raise SystemExit(f"README.md: no {HEADLINE_START} ... {HEADLINE_END} block")
    return readme[: start + len(HEADLINE_START)] + "\n" + table + readme[end:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if the page or README differ from the data")
    args = parser.parse_args()
    sets = load_sets()
    page = render_page(sets)
    readme = with_headline(README.read_text(), headline(sets))
    stale = [p for p, text in ((PAGE, page), (README, readme)) if not p.is_file() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(f"{p.relative_to(ROOT)} differs from what bench_results/ gives: run `make results`")
        sys.exit(1 if stale else 0)
    PAGE.write_text(page)
    README.write_text(readme)
    print(f"wrote {PAGE.relative_to(ROOT)} ({len(sets)} result sets) and README.md's headline table")


if __name__ == "__main__":
    main()
