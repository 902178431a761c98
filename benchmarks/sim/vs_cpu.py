"""The simulator against the real CPU benchmark: the reduced application benchmark's shapes (its
results.md, "Scaling") on a simulated builtin engine of a kind of CPU (`--setup`, default
`cpu-smollm2`: SmolLM2-135M in bf16 on 2 AMD AVX512-BF16 cores, its step costs fitted from
bench_results/sim-vs-cpu/fit-amd-avx512.json), each configuration's metric against the one
measured on that kind of CPU (`--real`, default the setup's).

    python -m benchmarks.sim.vs_cpu                          # ~1 min; bench_results/sim-vs-cpu/amd-avx512.{json,md}
    python -m benchmarks.sim.vs_cpu --setup cpu-smollm2-amx   # intel-amx.{json,md}, against the AMX fit's runs
    python -m benchmarks.sim.vs_cpu --setup cpu-smollm2-avx2  # amd-avx2.{json,md}

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

from benchmarks.apps.scaling import SCALES
from benchmarks.apps.workloads import all_scenarios, gpts, mixed
from benchmarks.apps.workloads.common import Corpus
from benchmarks.common.netsim import RttModel
from benchmarks.common.paper import load_paper_workloads
from benchmarks.common.resultset import RESULTS, write_manifest
from benchmarks.sim import workloads as w
from benchmarks.sim.cluster import CONFIGS, tokenizer_folder
from benchmarks.sim.suite import Point, Result, run_point
from benchmarks.sim.words import Words
from parrot.text import Tokenizer

OUT = RESULTS / "sim-vs-cpu"
CPU = "cpu-smollm2"
# Per simulated setup: the kind of CPU its profile was fitted on (the stem of the files written) and
# the real app benchmark's results on that kind of CPU, compared with.
SETUPS = {
    "cpu-smollm2": ("amd-avx512", OUT / "real-amd-avx512.json"),
    "cpu-smollm2-amx": ("intel-amx", OUT / "fit-intel-amx.json"),
    "cpu-smollm2-avx2": ("amd-avx2", RESULTS / "apps-vllm-amd-avx2" / "results.json"),
}
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


def real_metrics(path: Path) -> dict[tuple[str, str], dict[str, float]]:
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
    parser.add_argument("--setup", default=CPU, choices=sorted(SETUPS), help="the simulated setup")
    parser.add_argument("--real", type=Path, help="the real app benchmark's results.json (default: the setup's)")
    args = parser.parse_args()
    stem, real_path = SETUPS[args.setup]
    args.real = args.real or real_path
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
    write(args.out / stem, rows, results, args.real, args.setup)
    write_manifest(args.out, "sim-vs-cpu")


def write(
    stem: Path, rows: list[tuple[str, str, str, float, float | None]], results: list[Result], real: Path, setup: str
) -> None:
    """`stem`.md (the table) and `stem`.json (its rows and every simulated result)."""
    lines = ["# Simulated CPU against the real CPU benchmark", ""]
    lines += [
        f"Real: `{real}` (the median of its runs). Simulated: setup `{setup}` (`python -m benchmarks.sim.vs_cpu`).",
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
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    data = {"rows": rows, "results": [asdict(r) for r in results]}
    stem.with_suffix(".json").write_text(json.dumps(data, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
