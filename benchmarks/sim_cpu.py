"""The simulator against the real CPU benchmark: the reduced application benchmark's shapes
(bench_results/apps/results.md, "Scaling") on the simulated builtin engine of this machine
(setup `cpu-smollm2`: SmolLM2-135M on 2 cores, its step costs fitted from
bench_results/profile/step_profile.json), each configuration's metric against the measured one.

    python -m benchmarks.sim_cpu        # ~1 min; writes bench_results/sim_cpu/{results.json,results.md}

The real numbers are the medians of their runs (interleaved repeats), as the app table reports
them. The simulated apps take their shapes from the real scenarios (token counts, the GPTs arrival
schedule and warm-up, the mixed workload's chat turns tokenized from the real data, the
multi-agent app's own templates); chain, map-reduce and copilot are this package's versions of
those apps at the same token counts (benchmarks/sim/workloads.py). Needs the workload data
(`make data`).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks.apps import all_scenarios, gpts, mixed
from benchmarks.apps.common import Corpus
from benchmarks.netsim import RttModel
from benchmarks.scaling import SCALES, load_paper_workloads
from benchmarks.sim import workloads as w
from benchmarks.sim.cluster import CONFIGS, tokenizer_folder
from benchmarks.sim.suite import Point, Result, run_point
from benchmarks.sim.words import Words
from parrot.text import Tokenizer

# The app table of the engine the profile `cpu-smollm2` was fitted on (AVX512-BF16, bf16; its step
# profile: bench_results/profile_avx512_s13).
REAL = Path("bench_results/apps_avx512_s12_full/results.json")
OUT = Path("bench_results/sim_cpu")
CPU = "cpu-smollm2"
ALL = ("parrot", "a", "b", "c")


def cpu_points(corpus: Corpus, setup: str = CPU) -> list[tuple[Point, str]]:
    """(point, the metric compared) per real scenario of the quick app benchmark; the point key is
    the real scenario's. Shapes come from the real scenarios' parameters: token counts, the GPTs
    arrival schedule, the mixed workload's chat turns (tokenized from the real data), the
    multi-agent app's own templates."""
    real = {s.key: s.params for s in all_scenarios(SCALES["quick"], load_paper_workloads())}
    chain, many, mr = real["chain_summary/alone"], real["chain_summary/many4"], real["map_reduce/default"]
    copilot, mixed_params = real["copilot/n6"], real["mixed/default"]
    runs: dict[str, tuple[str, Any]] = {
        "chain_summary/alone": ("jct_s", chunked(w.run_chain, chain, docs=1)),
        "chain_summary/many4": ("mean_jct_s", chunked(w.run_many_chains, many, apps=many.num_apps)),
        "map_reduce/default": ("jct_s", chunked(w.run_map_reduce, mr, docs=1)),
        "multi_agent/files4": ("jct_s", partial(w.run_multi_agent_app, params=real["multi_agent/files4"])),
        "copilot/n6": (
            "mean_latency_s",
            partial(
                w.run_copilot,
                batch=copilot.num_requests,
                prompt_tokens=copilot.prompt_tokens,
                query_tokens=copilot.query_tokens,
                output_tokens=copilot.output_tokens,
            ),
        ),
        "mixed/default": (
            "chat_norm_latency_ms",
            partial(w.run_mixed, spec=mixed_spec(mixed_params), turns=chat_turns(mixed_params, corpus)),
        ),
    }
    for key, params in real.items():
        if key.startswith("gpts/"):
            apps = [
                {
                    "app_name": a.name,
                    "prompt_length": a.prompt_tokens,
                    "query_length": a.query_tokens,
                    "output_length": a.output_tokens,
                }
                for a in params.apps
            ]
            schedule = gpts.arrivals(params)
            runs[key] = (
                "norm_latency_ms",
                partial(
                    w.run_gpts, apps=apps, rate=params.rate, num_requests=len(schedule), schedule=schedule, warm=True
                ),
            )
    return [(Point(key, "", setup, ALL, run), metric) for key, (metric, run) in runs.items()]


def chunked(run: Any, params: Any, **kw: Any) -> Any:
    """`run` over the real scenario's chunks: their size, count and output length."""
    sizes = {"chunk_tokens": params.chunk_tokens, "num_chunks": params.num_chunks}
    return partial(run, output_tokens=params.output_tokens, **sizes, **kw)


def mixed_spec(params: mixed.Params) -> dict[str, Any]:
    starts = params.app_starts_s
    mr = params.map_reduce
    return {
        "chat": {"requests": params.num_chat},
        "map_reduce": {
            "apps": len(starts),
            "start_after_s": starts[0],
            "gaps_s": [b - a for a, b in itertools.pairwise(starts)] + [0.0],
            "chunk_tokens": mr.chunk_tokens,
            "output_tokens": mr.output_tokens,
            "num_chunks": mr.num_chunks,
        },
    }


def chat_turns(params: mixed.Params, corpus: Corpus) -> list[tuple[int, int]]:
    """(prompt tokens, output tokens) of the real mixed workload's chats (chat template applied)."""
    return [(len(corpus.tokenizer.encode(prompt)), n) for prompt, n in mixed.chat_prompts(params, corpus)]


def real_metrics(path: Path = REAL) -> dict[tuple[str, str], dict[str, float]]:
    """The median of each real scenario's runs (interleaved repeats), per configuration and metric."""
    runs: dict[tuple[str, str], dict[str, list[float]]] = {}
    for rec in json.loads(path.read_text())["records"]:
        slot = runs.setdefault((rec["scenario"], rec["config"]), {})
        for k, v in rec.get("metrics", {}).items():
            slot.setdefault(k, []).append(v)
    return {key: {k: statistics.median(v) for k, v in metrics.items()} for key, metrics in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--real", type=Path, default=REAL, help="the real app benchmark's results.json")
    parser.add_argument("--setup", default=CPU, help="the simulated setup (cpu-smollm2: AVX512-BF16, bf16)")
    args = parser.parse_args()
    rtt = RttModel.from_workloads(load_paper_workloads())
    tokenizer = Tokenizer(tokenizer_folder())
    words = Words(tokenizer)
    real = real_metrics(args.real)
    rows, results = [], []
    for point, metric in cpu_points(Corpus(tokenizer), args.setup):
        for config in point.configs:
            result = run_point(point, config, rtt, words)
            results.append(result)
            measured = real.get((point.key, config), {}).get(metric)
            sim = result.metrics[metric]
            rows.append((point.key, config, metric, sim, measured))
            print(point.key, config, metric, sim, measured, flush=True)
    write(args.out, rows, results, args.real, args.setup)


def write(
    out: Path, rows: list[tuple[str, str, str, float, float | None]], results: list[Result], real: Path, setup: str
) -> None:
    lines = ["# Simulated CPU against the real CPU benchmark", ""]
    lines += [
        f"Real: `{real}` (the median of its runs). Simulated: setup `{setup}` (`python -m benchmarks.sim_cpu`).",
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
