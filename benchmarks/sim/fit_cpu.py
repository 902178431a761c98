"""Fit the CPU's step costs from the builtin engine's measured step profile.

    python -m benchmarks.sim.fit_cpu

Reads a step profile (`python -m benchmarks.apps.step_profile`'s step_profile.json: per run, the
engine steps of each kind with their time, decode rows and prefill tokens; default
bench_results/sim-vs-cpu/fit-amd-avx512.json, the AMD AVX512 fit's), or an application benchmark's
results.json (`--profile bench_results/apps-.../results.json`: `benchmarks.apps` keeps the same
per-kind sums of each builtin-engine run; the runs of `--workloads` are read, so the fit and the
`benchmarks.sim.vs_cpu` check against that table share the machine's state), fits
`time = steps x a + prefill tokens x b + decode rows x c` by least squares over every (run, kind)
group, and prints the fit and its error, then the fit as a hardware profile for the cost model
(`--model`: the model profile whose weights a step reads, e.g. `smollm2-135m-fp32` for a float32
engine): a prefill token's body FLOPs give the effective TFLOP/s, the weights stream once a step
at `--bandwidth-gbps` (the rest of the per-step time is overhead), a decoded row costs its FLOPs at
that rate plus a per-row overhead. Paste it into `parrot/sim/profiles/hardware.toml`.

    python -m benchmarks.sim.fit_cpu --model smollm2-135m-fp32 --name cpu-2core-avx2
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.resultset import RESULTS
from parrot.sim import profiles

PROFILE = RESULTS / "sim-vs-cpu" / "fit-amd-avx512.json"
# From an application benchmark's results: the workloads the fit reads (the step profile's); the
# others (4 chains, multi-agent, copilot, mixed) are checked by `benchmarks.sim.vs_cpu` held out.
FIT_WORKLOADS = ("chain_summary", "map_reduce", "gpts")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", type=Path, default=PROFILE)
    parser.add_argument("--model", default="smollm2-135m", help="model profile (models.toml) the engine ran")
    parser.add_argument("--bandwidth-gbps", type=float, default=20.0, help="weights streamed once a step at this")
    parser.add_argument("--name", default="cpu-2core")
    parser.add_argument(
        "--workloads",
        nargs="+",
        default=list(FIT_WORKLOADS),
        help="from an application benchmark's results: the workloads fitted from (the rest stay held out)",
    )
    args = parser.parse_args()
    rows, times = [], []
    for run in step_groups(json.loads(args.profile.read_text()), set(args.workloads)):
        for kind in run.values():
            if kind["steps"]:
                rows.append([kind["steps"], kind["prefill_tokens"], kind["decode_rows"]])
                times.append(kind["seconds"])
    a, y = np.array(rows, dtype=float), np.array(times)
    fit, *_ = np.linalg.lstsq(a, y, rcond=None)
    error = float(np.abs(a @ fit - y).sum() / y.sum())
    step_ms, prefill_ms, decode_ms = (fit * 1000).tolist()
    print(f"{len(rows)} step groups from {args.profile}")
    print(f"per step {step_ms:.1f} ms, per prefill token {prefill_ms:.3f} ms, per decode row {decode_ms:.2f} ms")
    print(f"mean absolute error over the groups' time: {error:.1%}")
    print(profile_toml(args.name, profiles.model(args.model), step_ms, prefill_ms, decode_ms, args.bandwidth_gbps))


def step_groups(data: Any, workloads: set[str]) -> list[dict[str, dict[str, Any]]]:
    """Each run's steps by kind: a step profile's runs (all of them), or an application benchmark's
    builtin-engine runs (`benchmarks.apps` records with `steps`) of `workloads` (scenario keys
    start with the workload: `gpts/rate2`)."""
    if isinstance(data, list):
        return [run["kinds"] for run in data]
    return [
        r["steps"]
        for r in data["records"]
        if "steps" in r and "error" not in r and r["scenario"].split("/")[0] in workloads
    ]


def profile_toml(
    name: str, model: profiles.ModelProfile, step_ms: float, prefill_ms: float, decode_ms: float, bw_gbps: float
) -> str:
    """The fit as the cost model's terms (cost.py, combine = sum): a prefill token costs its body
    FLOPs at `peak_tflops`; a step reads the weights at `bw_gbps` (what it cannot explain of the
    per-step time is `step_overhead_ms`; a faster fit lowers the bandwidth instead); a decoded row
    costs its FLOPs (body + LM head) at `peak_tflops` plus `row_overhead_ms`."""
    tflops = 2 * model.body_params / (prefill_ms / 1000) / 1e12
    weights_ms = model.weight_bytes / (bw_gbps * 1e9) * 1000
    if weights_ms > step_ms:
        bw_gbps, weights_ms = model.weight_bytes / (step_ms / 1000) / 1e9, step_ms
    row_flops_ms = 2 * (model.body_params + model.head_params) / (tflops * 1e12) * 1000
    lines = [
        f"[{name}]",
        f"peak_tflops = {tflops:.3f}",
        f"mem_bw_gbps = {bw_gbps:.1f}",
        "mfu = 1.0",
        "bw_efficiency = 1.0",
        f"step_overhead_ms = {step_ms - weights_ms:.2f}",
        f"row_overhead_ms = {max(0.0, decode_ms - row_flops_ms):.2f}",
        'combine = "sum"',
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
