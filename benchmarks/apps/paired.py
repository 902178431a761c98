"""Paired reading of application benchmark runs: one configuration against another, repeat by repeat.

The report's table divides medians; on a shared 2-core machine a scenario's figure moves 5-10%
between adjacent runs of the same code, so a ratio of medians within a few percent of 1.0 says
little. Here each repeat of a scenario is a pair (the two configurations ran back to back,
`benchmarks.apps` alternates them), and for each metric this prints: the number of pairs, the
median ratio (baseline / other for times, other / baseline for rates, as the report), the range,
how many pairs the other configuration won, tied and lost, and the two-sided sign test's p-value
of the wins against the losses, ties left out (how surprising the split would be if neither
configuration were faster).

Where both configurations ran on real vLLM, the pair's vLLM timings (its own inter-token latency,
read from its /metrics by benchmarks/apps/run_cost.py) tell where a difference comes from: `vLLM ITL`
is the ratio of vLLM's own time between tokens, and `rest` the metric's ratio divided by it, the
part that vLLM's decode speed does not explain (the path to and from vLLM: client, manager,
adapter). A `rest` of 1.00 with an ITL ratio under 1.0 says vLLM itself decoded slower in those
runs; on a machine whose cores the engine saturates, that is the CPU the other processes took.

    python -m benchmarks.apps.paired bench_results/apps-vllm-amd-avx512/results.json [more results.json ...] \\
        [--baseline d] [--config parrot_vllm] [--only gpts mixed]

Two versions of the code, one configuration (run them alternately, each from its own tree):

    python -m benchmarks.apps.paired --config parrot --before base/run-*.json --after new/run-*.json

Runs of several files are pooled (the same scenario key in each). `benchmarks.apps` writes this
table for its own run as `paired.md` (for each pair of configurations on the same engine it ran,
report.SAME_ENGINE_PAIRS: (d) against Parrot+vLLM).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.apps.report import SAME_ENGINE_PAIRS, markdown, ratio


@dataclass
class Pairs:
    """One scenario metric's pairs: the metric's ratio and, where vLLM ran both, its ITL ratio."""

    label: str
    ratios: list[float] = field(default_factory=list)
    itl_ratios: list[float | None] = field(default_factory=list)


def sign_test_p(wins: int, n: int) -> float:
    """Two-sided sign test: the chance of a split at least this uneven among `n` fair coin flips."""
    if n == 0:
        return 1.0
    k = min(wins, n - wins)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def _itl(record: dict[str, Any]) -> float | None:
    return (record.get("vllm_timings_ms") or {}).get("itl_ms")


def collect(results: list[dict[str, Any]], baseline: str, config: str, only: list[str] | None) -> dict[str, Pairs]:
    """Pairs by "scenario / metric", pooled over `results` (records of the same repeat pair up)."""
    out: dict[str, Pairs] = {}
    for res in results:
        by_scenario: dict[str, dict[int, dict[str, dict[str, Any]]]] = {}  # scenario -> repeat -> config
        for r in res["records"]:
            if "error" not in r and r["config"] in (baseline, config):
                by_scenario.setdefault(r["scenario"], {}).setdefault(r.get("repeat", 0), {})[r["config"]] = r
        for s in res["scenarios"]:
            if only and s.get("workload") not in only and s["key"] not in only:
                continue
            for m in s["metrics"]:
                pairs = out.setdefault(f"{s['key']} / {m['key']}", Pairs(f"{s['label']}: {m['label']} ({m['unit']})"))
                for _, both in sorted(by_scenario.get(s["key"], {}).items()):
                    if len(both) < 2:
                        continue
                    b, c = both[baseline]["metrics"].get(m["key"]), both[config]["metrics"].get(m["key"])
                    r = ratio(b, c, m["lower_is_better"])
                    if r is not None:
                        pairs.ratios.append(r)
                        pairs.itl_ratios.append(ratio(_itl(both[baseline]), _itl(both[config])))
    return {k: v for k, v in out.items() if v.ratios}


def render(pairs: dict[str, Pairs], baseline: str, config: str) -> str:
    """The table; ratios above 1.0 mean `config` did better (see the module docstring)."""
    head = ["scenario: metric", "pairs", f"{baseline} vs {config}: median ratio (range)", "won / tied / lost"]
    head += ["sign test p", "vLLM ITL", "rest"]
    rows = [head, ["---"] * len(head)]
    for p in pairs.values():
        n, wins, losses = len(p.ratios), sum(r > 1.0 for r in p.ratios), sum(r < 1.0 for r in p.ratios)
        itl = [(r, i) for r, i in zip(p.ratios, p.itl_ratios, strict=True) if i is not None]
        rows.append(
            [
                p.label,
                str(n),
                f"{statistics.median(p.ratios):.3f}x ({min(p.ratios):.3f}-{max(p.ratios):.3f})",
                f"{wins} / {n - wins - losses} / {losses}",
                f"{sign_test_p(wins, wins + losses):.2g}",
                f"{statistics.median(i for _, i in itl):.3f}x" if itl else "—",
                f"{statistics.median(r / i for r, i in itl):.3f}x" if itl else "—",
            ]
        )
    return markdown(rows)


def versions(before: list[dict[str, Any]], after: list[dict[str, Any]], config: str) -> list[dict[str, Any]]:
    """Runs of two versions of the code as runs of two configurations: the i-th run of `before`
    paired with the i-th of `after` (run them alternately), `config`'s records renamed "before" and
    "after", so `collect` pairs each scenario's repeats across the two versions."""
    if len(before) != len(after):
        raise ValueError(f"{len(before)} runs before against {len(after)} after: pair them one to one")
    merged = []
    for b, a in zip(before, after, strict=True):
        records = [
            r | {"config": name}
            for name, res in (("before", b), ("after", a))
            for r in res["records"]
            if r["config"] == config
        ]
        merged.append({"scenarios": b["scenarios"], "records": records})
    return merged


def write_paired(results: dict[str, Any], out: Path) -> None:
    """`paired.md` in `out`: the table of each same-engine pair of configurations the run has."""
    tables = []
    for baseline, config in SAME_ENGINE_PAIRS:
        pairs = collect([results], baseline, config, None)
        if pairs:
            tables.append(f"## {baseline} against {config}, repeat by repeat\n\n{render(pairs, baseline, config)}")
    path = out / "paired.md"
    if tables:
        path.write_text("\n".join(tables))
    else:
        path.unlink(missing_ok=True)  # not an earlier run's table beside this run's results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, nargs="*", help="results.json files of benchmarks.apps")
    parser.add_argument("--baseline", default="d", help="the configuration in the numerator (times)")
    parser.add_argument("--config", default="parrot_vllm", help="the configuration compared with it")
    parser.add_argument("--only", nargs="*", help="workloads or scenario keys")
    parser.add_argument("--before", type=Path, nargs="*", help="runs of one version of the code (with --after)")
    parser.add_argument("--after", type=Path, nargs="*", help="runs of another version, run alternately with --before")
    args = parser.parse_args()
    if args.before or args.after:  # one configuration (--config) across two versions of the code
        before, after = ([json.loads(path.read_text()) for path in paths or ()] for paths in (args.before, args.after))
        results, baseline, config = versions(before, after, args.config), "before", "after"
    else:
        results = [json.loads(path.read_text()) for path in args.results]
        baseline, config = args.baseline, args.config
    pairs = collect(results, baseline, config, args.only)
    if not pairs:
        parser.error(f"no repeat ran both {baseline} and {config}")
    print(render(pairs, baseline, config), end="")


if __name__ == "__main__":
    main()
