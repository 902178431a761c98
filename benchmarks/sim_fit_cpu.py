"""Fit the CPU's step costs from the builtin engine's measured step profile.

    python -m benchmarks.sim_fit_cpu

Reads bench_results/profile/step_profile.json (`python -m benchmarks.step_profile`: per run, the
engine steps of each kind with their time, decode rows and prefill tokens), fits
`time = steps x a + prefill tokens x b + decode rows x c` by least squares over every (run, kind)
group, and prints the fit and its error: the numbers `parrot/sim/profiles/hardware.toml`
[cpu-2core] is derived from (see its `about`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

PROFILE = Path("bench_results/profile/step_profile.json")


def main() -> None:
    rows, times = [], []
    for run in json.loads(PROFILE.read_text()):
        for kind in run["kinds"].values():
            if kind["steps"]:
                rows.append([kind["steps"], kind["prefill_tokens"], kind["decode_rows"]])
                times.append(kind["seconds"])
    a, y = np.array(rows, dtype=float), np.array(times)
    fit, *_ = np.linalg.lstsq(a, y, rcond=None)
    error = float(np.abs(a @ fit - y).sum() / y.sum())
    step_ms, prefill_ms, decode_ms = (fit * 1000).tolist()
    print(f"{len(rows)} step groups from {PROFILE}")
    print(f"per step {step_ms:.1f} ms, per prefill token {prefill_ms:.3f} ms, per decode row {decode_ms:.2f} ms")
    print(f"mean absolute error over the groups' time: {error:.1%}")


if __name__ == "__main__":
    main()
