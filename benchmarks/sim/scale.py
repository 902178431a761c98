"""The manager at scale on the simulator: 16-256 simulated engines, 1k-10k applications at once.

    python -m benchmarks.sim.scale     # the table (engines x applications)
    python -m benchmarks.sim.scale --engines 16 --apps 1000

Each application is a two-call chain (a 512-token prompt whose first 256 tokens are a system
prompt shared by every application, 32 output tokens; then a refine call reading that output),
all submitted at t=0 to one manager over `engines` simulated A100 / LLaMA-13B engines on the
virtual clock. Measured in wall time: the manager's scheduling time per decision (one executor
step: views of changed calls, the policy's plan, applying it), its mean and p99, and per
dispatched call; the manager's memory per application (tracemalloc while submitting, before any
step runs); the garbage collector's share of the run's wall time and its longest pause (the
process's collector set as `parrot serve` sets it: parrot/web/heap.py). Writes results.json,
results.md and manifest.json to `--out` (default bench_results/sim-manager-scale-<machine kind>).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common.netsim import RttModel
from benchmarks.common.resultset import default_out, write_manifest
from benchmarks.sim.cluster import CONFIGS, Call, Cluster, Input, Ref, run_parrot, tokenizer_folder
from benchmarks.sim.words import Words
from parrot.serve.policy.plan import Plan, Snapshot
from parrot.sim import profiles
from parrot.sim.loop import run_virtual
from parrot.text import Tokenizer
from parrot.web.heap import settle_heap

OUT = default_out("sim-manager-scale")


def app_calls(words: Words, system: str, i: int) -> list[Call]:
    first = Call((system, Input(words.text(f"scale/{i}", 256)), "\nAnswer:"), f"x{i}", 32)
    second = Call(("Refine:", Ref(f"x{i}"), "\nRefined:"), f"y{i}", 32)
    return [first, second]


class GcMeter:
    """The cyclic collector's pauses while on: their count, total and longest (gc.callbacks)."""

    def __init__(self) -> None:
        self.count = 0
        self.total_s = 0.0
        self.longest_s = 0.0
        self._began = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            return
        pause = time.perf_counter() - self._began
        self.count += 1
        self.total_s += pause
        self.longest_s = max(self.longest_s, pause)

    def __enter__(self) -> GcMeter:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


def run_scale(num_engines: int, num_apps: int, words: Words) -> dict[str, Any]:
    system = words.text("scale/system", 256)
    apps = [app_calls(words, system, i) for i in range(num_apps)]

    async def main() -> dict[str, Any]:
        async with Cluster(profiles.setup("a100-13b"), CONFIGS["parrot"], num_engines) as cluster:
            executor = cluster.manager.executor
            step_times: list[float] = []
            dispatched = [0]
            inner: Callable[[], Plan] = executor.step

            def timed_step() -> Plan:
                t = time.perf_counter()
                plan = inner()
                step_times.append(time.perf_counter() - t)
                dispatched[0] += len(plan.dispatch)
                return plan

            executor.step = timed_step  # type: ignore[method-assign]
            plan_times: list[float] = []
            policy_plan = executor.policy.plan

            def timed_plan(snapshot: Snapshot) -> Plan:
                t = time.perf_counter()
                plan = policy_plan(snapshot)
                plan_times.append(time.perf_counter() - t)
                return plan

            executor.policy.plan = timed_plan  # type: ignore[method-assign]
            rtt = RttModel((0.0,)).sampler("scale")
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            # Submissions without awaiting: every app is in the manager before the first step.
            tasks = [
                asyncio.ensure_future(run_parrot(cluster.manager, calls, [calls[-1].output], rtt)) for calls in apps
            ]
            await asyncio.sleep(0)  # each task runs to its submit (an RTT of 0 sleeps 0 s)
            await asyncio.sleep(0)
            held = tracemalloc.get_traced_memory()[0] - before
            tracemalloc.stop()
            wall = time.perf_counter()
            start = asyncio.get_running_loop().time()
            with GcMeter() as collector:
                results = await asyncio.gather(*tasks)
            wall = time.perf_counter() - wall
            ordered = sorted(step_times)
            return {
                "engines": num_engines,
                "apps": num_apps,
                "calls": 2 * num_apps,
                "virtual_s": asyncio.get_running_loop().time() - start,
                "wall_s": wall,
                "mean_jct_s": sum(r.latency_s for r in results) / len(results),
                "steps": len(step_times),
                "step_ms_mean": 1000 * sum(step_times) / len(step_times),
                "step_ms_p99": 1000 * ordered[int(0.99 * (len(ordered) - 1))],
                "step_ms_max": 1000 * ordered[-1],
                "sched_ms_per_dispatch": 1000 * sum(step_times) / max(1, dispatched[0]),
                "plan_ms_mean": 1000 * sum(plan_times) / len(plan_times),
                "plan_ms_p99": 1000 * sorted(plan_times)[int(0.99 * (len(plan_times) - 1))],
                "plan_ms_per_dispatch": 1000 * sum(plan_times) / max(1, dispatched[0]),
                "kb_per_app": held / num_apps / 1024,
                "gc_collections": collector.count,
                "gc_s": collector.total_s,
                "gc_share": collector.total_s / wall,
                "gc_pause_ms_max": 1000 * collector.longest_s,
            }

    return run_virtual(main())


def write(out: Path, rows: list[dict[str, Any]]) -> None:
    lines = ["# The manager at scale (simulated engines, virtual clock)", ""]
    lines += [
        "| engines | apps | calls | virtual s | wall s | steps | step ms mean | p99 | max | step ms per dispatch "
        "| plan ms mean | plan p99 | plan ms per dispatch | KB per app | GC share of wall | longest GC pause ms |"
    ]
    lines += ["|" + "---:|" * 16]
    for r in rows:
        lines.append(
            f"| {r['engines']} | {r['apps']} | {r['calls']} | {r['virtual_s']:.1f} | {r['wall_s']:.1f} | "
            f"{r['steps']} | "
            f"{r['step_ms_mean']:.2f} | {r['step_ms_p99']:.2f} | {r['step_ms_max']:.1f} | "
            f"{r['sched_ms_per_dispatch']:.3f} | {r['plan_ms_mean']:.2f} | {r['plan_ms_p99']:.2f} | "
            f"{r['plan_ms_per_dispatch']:.3f} | {r['kb_per_app']:.1f} | {100 * r['gc_share']:.0f}% | "
            f"{r['gc_pause_ms_max']:.0f} |"
        )
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text("\n".join(lines) + "\n")
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", type=int, nargs="*", default=[16, 64, 256])
    parser.add_argument("--apps", type=int, nargs="*", default=[1000, 10000])
    parser.add_argument("--big", type=int, default=10000, help="apps counts >= this run only at the most engines")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    words = Words(Tokenizer(tokenizer_folder()))
    settle_heap()  # as `parrot serve` does once it has started
    rows = []
    for engines in args.engines:
        for apps in args.apps:
            if apps >= args.big and engines != max(args.engines):
                continue
            row = run_scale(engines, apps, words)
            print(row, flush=True)
            rows.append(row)
    write(args.out, rows)
    write_manifest(args.out, "sim-scale")


if __name__ == "__main__":
    main()
