"""`parrot bench NAME [ARGS...]`: the benchmark entry points (`benchmarks/` of a source checkout)."""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

import parrot

# name -> module; `make bench` is `apps --mode quick`.
BENCHMARKS = {
    "apps": "benchmarks.apps",
    "engine": "benchmarks.engine",
    "kernels": "benchmarks.engine.kernels",
    "attention": "benchmarks.attention.shared_prefix",
    "attention-prefill": "benchmarks.attention.prefill",
    "step-profile": "benchmarks.apps.step_profile",
    "tenant-flood": "benchmarks.serving.tenant_flood",
    "manager-path": "benchmarks.serving.manager_path",
    "invariance": "benchmarks.engine.invariance",
    "sim-paper": "benchmarks.sim.paper",
    "sim-scale": "benchmarks.sim.scale",
    "sim-vs-cpu": "benchmarks.sim.vs_cpu",
    "report": "benchmarks.apps.report",
}


def bench_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", help=f"one of: {', '.join(BENCHMARKS)}")
    p.add_argument("args", nargs=argparse.REMAINDER, help="passed to the benchmark (try --help)")
    p.add_argument("--list", action="store_true", help="list the benchmarks")


def cmd_bench(a: argparse.Namespace) -> None:
    if a.list or a.name is None:
        for name, module in BENCHMARKS.items():
            print(f"{name:18} python -m {module}")
        return
    if a.name not in BENCHMARKS:
        raise SystemExit(f"unknown benchmark {a.name!r}; allowed: {', '.join(BENCHMARKS)}")
    module = BENCHMARKS[a.name]
    root = Path(parrot.__file__).resolve().parents[1]
    if not (root / "benchmarks" / "__init__.py").is_file():
        raise SystemExit(f"the benchmarks live in the source checkout; none next to {root / 'parrot'}")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    sys.argv = [module, *a.args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
