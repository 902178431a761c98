"""Where an application's time goes on the builtin engine: every engine step of each run, by kind.

    python -m benchmarks.apps.step_profile copilot gpts --configs parrot a c

Runs the chosen workloads (`benchmarks.apps` names, quick scale) on the chosen configurations
(`parrot`, `a`, `b`, `c`, or an ablation key), each served in this process as in `benchmarks.apps`,
with the engine's step trace on (`LLMEngine.start_trace`). For each run it prints the app's metric,
the wall time, the round trips paid, the engine's busy time, and the steps split into decode-only,
prefill-only and mixed: how many, their time, and their mean rows. Writes step_profile.json,
step_profile.md and manifest.json to `--out` (default bench_results/step-profile-<machine kind>;
`benchmarks.sim.fit_cpu` fits the simulator's CPU step costs from step_profile.json). One run per
(workload, configuration): a profile, not a benchmark (the ratios belong to `benchmarks.apps`).

Then, for the decode-only steps of each run, the same batch alone: right after the run, on the
same engine in the same process, `StepTimer` (benchmarks/engine/step_timer.py) decodes that many
sequences of the run's mean length with the loop thread stopped (only the step is timed), traced
the same way. The second table compares medians per batch size, the forward pass
(`StepRecord.elapsed_s`) and the whole step in the loop thread (scheduling to the events'
hand-off, `StepRecord.step_s`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.apps import run as bench
from benchmarks.apps.configs import plan_configs
from benchmarks.apps.deploy import LocalServer
from benchmarks.apps.scaling import SCALES
from benchmarks.apps.servers import WARM_PROMPT, latency_target, openai_factory, running, server_spec, warm_all
from benchmarks.apps.step_kinds import KINDS, kind_of, summarize
from benchmarks.apps.workloads import all_scenarios
from benchmarks.apps.workloads.common import Corpus
from benchmarks.common.netsim import RttModel
from benchmarks.common.paper import load_paper_workloads
from benchmarks.common.resultset import default_out, write_manifest
from benchmarks.engine.step_timer import StepTimer
from parrot.engine.config import resolve_dtype
from parrot.engine.openmp import on_passing_thread
from parrot.engine.trace import StepRecord
from parrot.text import Tokenizer


def decode_batches(trace: list[StepRecord], min_steps: int) -> dict[int, list[StepRecord]]:
    """Decode-only steps by batch size (rows), the sizes with at least `min_steps` steps."""
    by_size: dict[int, list[StepRecord]] = {}
    for r in trace:
        if kind_of(r) == "decode":
            by_size.setdefault(r.num_decode, []).append(r)
    return {n: rs for n, rs in sorted(by_size.items()) if len(rs) >= min_steps}


def alone(engine: Any, batch: int, seq_len: int, steps: int = 24) -> list[StepRecord]:
    """Decode steps of `batch` sequences of about `seq_len` tokens with nothing else running
    (the warm-up steps and the fills left out). Stepped on a thread that ends (`on_passing_thread`):
    one that lived on would keep its OpenMP team and slow the next run's steps (parrot/engine/openmp.py)."""
    engine.start_trace()
    on_passing_thread(lambda: StepTimer(engine).decode_ms(batch, steps=steps, prompt_len=max(1, seq_len)))
    return [r for r in engine.stop_trace() if kind_of(r) == "decode" and r.num_decode == batch][2:]


def compare(app: dict[int, list[StepRecord]], engine: Any) -> list[dict[str, float]]:
    out = []
    for n, steps in app.items():
        seq_len = round(statistics.mean(r.num_kv_tokens for r in steps) / n)
        solo = alone(engine, n, seq_len)
        row = {"rows": n, "steps": len(steps), "seq_len": seq_len}
        for field in ("elapsed_s", "step_s"):
            for name, records in (("app", steps), ("alone", solo)):
                values = [getattr(r, field) for r in records]
                row[f"{name}_{field}"] = statistics.median(values)
                row[f"{name}_{field}_p20"] = statistics.quantiles(values, n=5)[0]
        out.append(row)
    return out


def compare_markdown(rows: list[dict[str, Any]]) -> str:
    head = ["workload", "config", "rows", "steps", "tokens/seq", "forward in app ms", "forward alone ms", "ratio"]
    head += ["step in app ms", "step alone ms", "ratio"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        for c in row["decode_vs_alone"]:
            cells = [row["scenario"], row["config"], str(c["rows"]), str(c["steps"]), str(c["seq_len"])]
            for field in ("elapsed_s", "step_s"):
                app, solo = 1000 * c[f"app_{field}"], 1000 * c[f"alone_{field}"]
                cells += [f"{app:.1f}", f"{solo:.1f}", f"{app / solo:.2f}x"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def summary_markdown(rows: list[dict[str, Any]]) -> str:
    """Over the repeats: per (workload, configuration, batch size), the medians over runs of each
    run's median step times and of its ratios, at the median and at the 20th percentile (the fast
    steps: on a machine shared with other work, load bursts slow the median of either side)."""
    groups: dict[tuple[str, str, int], list[dict[str, float]]] = {}
    for row in rows:
        for c in row["decode_vs_alone"]:
            groups.setdefault((row["scenario"], row["config"], c["rows"]), []).append(c)
    head = ["workload", "config", "rows", "runs", "forward in app ms", "forward alone ms", "ratio", "ratio at p20"]
    head += ["step in app ms", "step alone ms", "ratio", "ratio at p20"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (scenario, config, n), cs in groups.items():
        cells = [scenario, config, str(n), str(len(cs))]
        for field in ("elapsed_s", "step_s"):
            app = statistics.median(1000 * c[f"app_{field}"] for c in cs)
            solo = statistics.median(1000 * c[f"alone_{field}"] for c in cs)
            ratio = statistics.median(c[f"app_{field}"] / c[f"alone_{field}"] for c in cs)
            fast = statistics.median(c[f"app_{field}_p20"] / c[f"alone_{field}_p20"] for c in cs)
            cells += [f"{app:.1f}", f"{solo:.1f}", f"{ratio:.2f}x", f"{fast:.2f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def markdown(rows: list[dict[str, Any]]) -> str:
    head = ["workload", "config", "metric", "wall s", "round trips s", "engine busy s"]
    for k in KINDS:
        head += [f"{k} steps", f"{k} s", f"{k} ms/step", f"{k} rows/step"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["scenario"], row["config"], row["metric"], f"{row['wall_s']:.2f}"]
        cells += [f"{row['round_trip_s']:.2f}", f"{row['busy_s']:.2f}"]
        for k in KINDS:
            s = row["kinds"][k]
            n = s["steps"]
            rows_per = (s["decode_rows"] + s["prefill_tokens"]) / n if n else 0.0
            cells += [str(n), f"{s['seconds']:.2f}", f"{1000 * s['seconds'] / n:.1f}" if n else "-", f"{rows_per:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("workloads", nargs="+", help="benchmarks.apps workload names (chain_summary, gpts, ...)")
    parser.add_argument("--configs", nargs="+", default=["parrot", "a"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, help="default: bench_results/step-profile-<machine kind>")
    parser.add_argument("--min-steps", type=int, default=5, help="batch sizes compared alone: this many app steps")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each (workload, configuration), interleaved")
    args = parser.parse_args(argv)
    args.out = args.out or default_out("step-profile")
    scale, paper = SCALES["quick"], load_paper_workloads()
    scenarios = all_scenarios(scale, paper, set(args.workloads))
    rows: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        dtype = resolve_dtype("auto")
        plan = plan_configs("smollm2-135m", dtype, args.threads, bench.KV_CACHE_BYTES["quick"])
        lat = stack.enter_context(running(server_spec(plan, "lat")))
        tpot, _ = latency_target(lat, openai_factory(lat.url, lat.model))
        plan = plan_configs("smollm2-135m", dtype, args.threads, bench.KV_CACHE_BYTES["quick"], tpot)
        configs = [c for c in plan.configs if c.key in args.configs]
        missing = set(args.configs) - {c.key for c in configs}
        if missing:
            raise SystemExit(f"unknown configurations {sorted(missing)}; known: {[c.key for c in plan.configs]}")
        servers: dict[str, Any] = {"lat": lat}
        for c in configs:
            if c.server not in servers:
                servers[c.server] = stack.enter_context(running(server_spec(plan, c.server)))
        clients = {n: openai_factory(s.url, s.model) for n, s in servers.items()}
        corpus = Corpus(Tokenizer(lat.engine.model_folder))
        rtt = RttModel.from_workloads(paper, 1.0)
        ctx = bench.Context(scale, corpus, rtt, servers, clients, dict.fromkeys(servers, "openai"), 300.0)
        corpus.documents(1, 0)
        asyncio.run(warm_all({n: s for n, s in servers.items() if n != "lat"}, clients, WARM_PROMPT))
        for scenario, config in [(s, c) for _ in range(args.repeats) for s in scenarios for c in configs]:
            if not bench.applicable(scenario, config):
                continue
            server: LocalServer = servers[config.server]
            server.engine.engine.start_trace()
            began = time.perf_counter()
            record = asyncio.run(bench.run_unit(scenario, config, ctx))
            wall = time.perf_counter() - began
            trace = server.engine.engine.stop_trace()
            metrics = record.get("metrics", {})
            first = next(iter(metrics.items()), ("error", float("nan")))
            row = {
                "scenario": scenario.key,
                "config": config.key,
                "metric": f"{first[0]}={first[1]:.3f}" if "error" not in record else record["error"],
                "wall_s": wall,
                "round_trip_s": record["round_trip_s"],
                "busy_s": sum(r.elapsed_s for r in trace),
                "kinds": {k: asdict(v) for k, v in summarize(trace).items()},
                "decode_vs_alone": compare(decode_batches(trace, args.min_steps), server.engine.engine),
            }
            rows.append(row)
            print(markdown([row]).splitlines()[-1], flush=True)
            print(compare_markdown([row]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "step_profile.json").write_text(json.dumps(rows, indent=1))
    table = markdown(rows) + "\n" + compare_markdown(rows) + "\n" + summary_markdown(rows)
    (args.out / "step_profile.md").write_text(table)
    write_manifest(args.out, "step-profile")
    print(table)


if __name__ == "__main__":
    main()
