"""The simulator against the real CPU benchmark: the reduced application benchmark's shapes
(bench_results/apps/results.md, "Scaling") on the simulated builtin engine of this machine
(setup `cpu-smollm2`: SmolLM2-135M on 2 cores, its step costs fitted from
bench_results/profile/step_profile.json), each configuration's metric against the measured one.

    python -m benchmarks.sim_cpu        # ~1 min; writes bench_results/sim_cpu/{results.json,results.md}

The real numbers are the best of their runs (the machine is shared: other work only adds time).
The simulated apps are this package's versions of the apps (benchmarks/sim/workloads.py), at the
same token counts, not the real apps' exact templates; see the table's notes.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from functools import partial
from pathlib import Path

from benchmarks.netsim import RttModel
from benchmarks.scaling import load_paper_workloads
from benchmarks.sim import workloads as w
from benchmarks.sim.cluster import CONFIGS, tokenizer_folder
from benchmarks.sim.suite import Point, Result, run_point
from benchmarks.sim.words import Words
from parrot.text import Tokenizer

REAL = Path("bench_results/apps/results.json")
OUT = Path("bench_results/sim_cpu")
CPU = "cpu-smollm2"
ALL = ("parrot", "a", "b", "c")
GPTS_APPS = [
    {"app_name": "Productivity", "prompt_length": 930, "query_length": 7, "output_length": 32},
    {"app_name": "Image Generation", "prompt_length": 140, "query_length": 8, "output_length": 25},
    {"app_name": "Programming", "prompt_length": 212, "query_length": 4, "output_length": 32},
    {"app_name": "Data Analysis", "prompt_length": 254, "query_length": 4, "output_length": 26},
]
# The paper's multi-agent shape scaled as the quick benchmark scales it: prompts / 8, outputs 32.
AGENTS = {
    "round0": {"prompt_tokens": 31, "output_tokens": 32},
    "rounds": [
        {"role": "coder", "shared_prefix_tokens": 442, "suffix_tokens": [9, 15], "output_tokens": [32]},
        {"role": "reviewer", "shared_prefix_tokens": 607, "suffix_tokens": [9, 15], "output_tokens": [32]},
        {"role": "reviser", "shared_prefix_tokens": 669, "suffix_tokens": [9, 15], "output_tokens": [32]},
    ],
}
MIXED = {
    "chat": {"requests": 8, "max_prompt_tokens": 256, "output_tokens": (25, 32)},
    "map_reduce": {
        "apps": 2,
        "start_after_s": 1.0,
        "gaps_s": [2.0, 0.0],
        "chunk_tokens": 256,
        "output_tokens": 25,
        "num_chunks": 4,
    },
}


def cpu_points() -> list[tuple[Point, str]]:
    """(point, the metric compared) per real scenario; the point key is the real scenario's."""
    runs = {
        "chain_summary/alone": (
            "jct_s",
            partial(w.run_chain, docs=1, chunk_tokens=256, output_tokens=25, num_chunks=4),
        ),
        "chain_summary/many4": (
            "mean_jct_s",
            partial(w.run_many_chains, apps=4, chunk_tokens=256, output_tokens=25, num_chunks=3),
        ),
        "map_reduce/default": (
            "jct_s",
            partial(w.run_map_reduce, docs=1, chunk_tokens=256, output_tokens=25, num_chunks=8),
        ),
        "multi_agent/files4": ("jct_s", partial(w.run_multi_agent, spec=AGENTS, files=4, rounds=(1, 2, 3))),
        "copilot/n6": (
            "mean_latency_s",
            partial(w.run_copilot, batch=6, prompt_tokens=1024, query_tokens=16, output_tokens=25),
        ),
        "mixed/default": ("chat_norm_latency_ms", partial(w.run_mixed, spec=MIXED)),
    }
    pts = [(Point(key, "", CPU, ALL, run), metric) for key, (metric, run) in runs.items()]
    for rate in (2, 4, 8):
        run = partial(w.run_gpts, apps=GPTS_APPS, rate=float(rate), num_requests=8)
        pts.append((Point(f"gpts/rate{rate}", "", CPU, ALL, run), "norm_latency_ms"))
    return pts


def real_metrics() -> dict[tuple[str, str], dict[str, float]]:
    """The best (lowest) of each real scenario's runs, per configuration and metric."""
    best: dict[tuple[str, str], dict[str, float]] = {}
    for rec in json.loads(REAL.read_text())["records"]:
        slot = best.setdefault((rec["scenario"], rec["config"]), {})
        for k, v in rec["metrics"].items():
            slot[k] = min(v, slot.get(k, v))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    rtt = RttModel.from_workloads(load_paper_workloads())
    words = Words(Tokenizer(tokenizer_folder()))
    real = real_metrics()
    rows, results = [], []
    for point, metric in cpu_points():
        for config in point.configs:
            result = run_point(point, config, rtt, words)
            results.append(result)
            measured = real.get((point.key, config), {}).get(metric)
            sim = result.metrics[metric]
            rows.append((point.key, config, metric, sim, measured))
            print(point.key, config, metric, sim, measured, flush=True)
    write(args.out, rows, results)


def write(out: Path, rows: list[tuple[str, str, str, float, float | None]], results: list[Result]) -> None:
    lines = ["# Simulated CPU against the real CPU benchmark", ""]
    lines += [
        f"Real: `{REAL}` (best of runs). Simulated: setup `{CPU}` (`python -m benchmarks.sim_cpu`).",
        "",
    ]
    lines += ["| workload | configuration | metric | real | simulated | error |", "|---|---|---|---:|---:|---:|"]
    errors: dict[str, list[float]] = {}
    for key, config, metric, sim, measured in rows:
        err = None if measured is None else (sim - measured) / measured
        if err is not None:
            errors.setdefault(key, []).append(abs(err))
        shown = "—" if err is None else f"{err:+.0%}"
        real_s = "—" if measured is None else f"{measured:.2f}"
        lines.append(f"| {key} | {CONFIGS[config].label} | {metric} | {real_s} | {sim:.2f} | {shown} |")
    lines += ["", "| workload | mean abs. error over configurations | within 20% |", "|---|---:|---|"]
    for key, errs in errors.items():
        m = sum(errs) / len(errs)
        lines.append(f"| {key} | {m:.0%} | {'yes' if m <= 0.2 else 'no'} |")
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text("\n".join(lines) + "\n")
    (out / "results.json").write_text(json.dumps({"rows": rows, "results": [asdict(r) for r in results]}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
