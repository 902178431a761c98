"""The application benchmarks' report: results.json, a Markdown table of ratios, and PNG plots.

Pure functions of the results dict that benchmarks/apps/run.py builds (so the table is testable without
running anything). Ratios are baseline / Parrot for times (above 1: Parrot is faster) and Parrot /
baseline for rates.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

MISSING = "—"


def measured(results: dict[str, Any], scenario: str, config: str, metric: str) -> list[float]:
    """The metric of every repeat that passed its checks."""
    return [
        r["metrics"][metric]
        for r in results["records"]
        if r["scenario"] == scenario and r["config"] == config and "error" not in r and metric in r.get("metrics", {})
    ]


def value(results: dict[str, Any], scenario: str, config: str, metric: str) -> float | None:
    """The median of the repeats that passed their checks; None if none did."""
    runs = measured(results, scenario, config, metric)
    return statistics.median(runs) if runs else None


def fmt_spread(results: dict[str, Any], scenario: str, config: str, metric: str) -> str:
    """The median, and with several repeats their range: "4.91 (4.80-5.02)"."""
    runs = measured(results, scenario, config, metric)
    if len(runs) < 2:
        return fmt(value(results, scenario, config, metric))
    return f"{fmt(statistics.median(runs))} ({fmt(min(runs))}-{fmt(max(runs))})"


def num_runs(results: dict[str, Any], scenario: str, configs: list[str]) -> int:
    """The fewest passing runs any of `configs` had of `scenario` (each figure is the median of its runs)."""
    counts = [
        sum(1 for r in results["records"] if r["scenario"] == scenario and r["config"] == c and "error" not in r)
        for c in configs
    ]
    return min(counts, default=0)


def ratio(baseline: float | None, parrot: float | None, lower_is_better: bool = True) -> float | None:
    if baseline is None or parrot is None or baseline <= 0 or parrot <= 0:
        return None
    return baseline / parrot if lower_is_better else parrot / baseline


def fmt(x: float | None, digits: int = 2) -> str:
    if x is None:
        return MISSING
    return f"{x:.{digits}f}" if abs(x) < 1000 else f"{x:.0f}"


def fmt_ratio(x: float | None) -> str:
    return MISSING if x is None else f"{x:.2f}x"


def main_configs(results: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in results["configs"] if not c["ablation"]]


def ablation_configs(results: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in results["configs"] if c["ablation"]]


SUSTAINABLE_FACTOR = 1.5


def derive(results: dict[str, Any]) -> dict[str, Any]:
    """GPTs serving: per configuration, the highest rate up to which every measured rate keeps its
    normalized latency under a threshold: `SUSTAINABLE_FACTOR` x the best normalized latency at
    the lowest rate (any configuration); 0 if even the lowest rate is over it."""
    gpts = [s for s in results["scenarios"] if s["workload"] == "gpts"]
    if not gpts:
        return {}
    rates = sorted(s["plots"][0][2] for s in gpts)
    by_rate = {s["plots"][0][2]: s["key"] for s in gpts}
    lowest = [value(results, by_rate[rates[0]], c["key"], "norm_latency_ms") for c in main_configs(results)]
    known = [v for v in lowest if v is not None]
    if not known:
        return {}
    threshold = SUSTAINABLE_FACTOR * min(known)
    sustainable: dict[str, float] = {}
    for c in main_configs(results):
        sustainable[c["key"]] = 0.0
        for r in rates:
            v = value(results, by_rate[r], c["key"], "norm_latency_ms")
            if v is None or v > threshold:
                break
            sustainable[c["key"]] = r
    return {"gpts_threshold_ms": threshold, "gpts_rates": rates, "gpts_sustainable_rate": sustainable}


# (baseline, the Parrot configuration on the same engine): a ratio column each, after those vs Parrot.
SAME_ENGINE_PAIRS = (("d", "parrot_vllm"),)


def ratio_columns(configs: list[dict[str, Any]]) -> list[tuple[int, int, str]]:
    """(baseline's index, reference's index, header) of each ratio column: every configuration
    against Parrot (the first), then each baseline against the Parrot that runs on its engine."""
    keys = [c["key"] for c in configs]
    columns = [(i, 0, f"{c['label'].split()[0]}/Parrot") for i, c in enumerate(configs) if i > 0]
    for baseline, reference in SAME_ENGINE_PAIRS:
        if baseline in keys and reference in keys:
            i, j = keys.index(baseline), keys.index(reference)
            columns.append((i, j, f"{configs[i]['label'].split()[0]}/{configs[j]['label'].split()[0]}"))
    return columns


def render_table(results: dict[str, Any]) -> str:
    configs = main_configs(results)
    columns = ratio_columns(configs)
    head = ["workload", "metric", *(c["label"] for c in configs)]
    head += [header for _, _, header in columns] + ["runs", "paper"]
    rows = [head, ["---"] * len(head)]
    paper = results.get("paper_results", {})
    for s in results["scenarios"]:
        for m in s["metrics"]:
            values = [value(results, s["key"], c["key"], m["key"]) for c in configs]
            ratios = [ratio(values[i], values[j], m["lower_is_better"]) for i, j, _ in columns]
            rows.append(
                [
                    s["label"],
                    f"{m['label']} ({m['unit']})",
                    *(fmt_spread(results, s["key"], c["key"], m["key"]) for c in configs),
                    *map(fmt_ratio, ratios),
                    str(num_runs(results, s["key"], [c["key"] for c in configs])),
                    str(paper.get(s["paper_key"], MISSING)),
                ]
            )
    derived = results.get("derived", {})
    if derived.get("gpts_sustainable_rate"):
        rows.append(_sustainable_row(derived, configs, str(paper.get("gpts_serving", MISSING))))
    return markdown(rows)


def _sustainable_row(derived: dict[str, Any], configs: list[dict[str, Any]], paper: str) -> list[str]:
    """A rate of 0 means even the lowest measured rate was over the threshold: shown as "< lowest",
    and Parrot's ratio against it as a lower bound."""
    lowest = derived["gpts_rates"][0]
    rates = [derived["gpts_sustainable_rate"].get(c["key"]) for c in configs]
    shown = [f"< {lowest:g}" if r == 0 else fmt(r) for r in rates]
    ratios = []
    for i, j, _ in ratio_columns(configs):
        r, parrot = rates[i], rates[j]
        if r == 0 and parrot:
            ratios.append(f"> {parrot / lowest:.2f}x")
        else:
            ratios.append(fmt_ratio(ratio(r, parrot, lower_is_better=False)))
    metric = f"sustainable rate at <= {derived['gpts_threshold_ms']:.0f} ms/token (req/s)"
    return ["GPTs serving", metric, *shown, *ratios, MISSING, paper]


def render_ablations(results: dict[str, Any]) -> str:
    """One row per (scenario, metric, ablation) that ran: Parrot, Parrot with the optimization off,
    and their ratio (above 1: the optimization helps)."""
    ablations = ablation_configs(results)
    if not ablations:
        return ""
    rows = [["workload", "metric", "optimization off", "Parrot", "without it", "ratio"], ["---"] * 6]
    ran = {(r["scenario"], r["config"]) for r in results["records"]}
    for s in results["scenarios"]:
        for m in s["metrics"]:
            parrot = value(results, s["key"], "parrot", m["key"])
            for c in ablations:
                if (s["key"], c["key"]) not in ran:
                    continue
                off = value(results, s["key"], c["key"], m["key"])
                rows.append(
                    [
                        s["label"],
                        f"{m['label']} ({m['unit']})",
                        c["label"],
                        fmt(parrot),
                        fmt(off),
                        fmt_ratio(ratio(off, parrot, m["lower_is_better"])),
                    ]
                )
    return markdown(rows)


def render_profile(results: dict[str, Any]) -> str:
    """Where each configuration's time goes, from the first run of every scenario: round trips paid
    (count and seconds, all calls, not only the critical path), prompt tokens the engine computed,
    tokens generated, the peak of KV cache in use (cached prefixes included), the most sequences
    the engine was running at once (sampled every 50 ms), the CPU seconds the run took in the
    benchmark's process (clients, manager, builtin engines; the manager's thread and pool apart)
    and in a peer server's processes (vLLM), what the rest of the machine took meanwhile (other
    processes or tenants, the hypervisor's steal: a neighbour's share of the two cores shows
    there), and for runs on vLLM its own mean time per request (arrival to finish, its /metrics)."""
    labels = {c["key"]: c["label"] for c in results["configs"]}
    head = [
        "workload",
        "configuration",
        "wall (s)",
        "round trips",
        "round trips (s)",
        "prefill tokens",
        "generated tokens",
        "peak KV tokens",
        "peak running",
        "CPU here (s)",
        "manager thread CPU (s)",
        "peer CPU (s)",
        "others' CPU (s)",
        "steal (s)",
        "vLLM e2e (ms)",
    ]
    rows = [head, ["---"] * len(head)]
    scenario_labels = {s["key"]: s["label"] for s in results["scenarios"]}
    for r in results["records"]:
        if r.get("repeat", 0) != 0:
            continue
        rows.append(
            [
                scenario_labels.get(r["scenario"], r["scenario"]),
                labels.get(r["config"], r["config"]),
                fmt(r.get("wall_s"), 1),
                str(r.get("round_trips", MISSING)),
                fmt(r.get("round_trip_s"), 1),
                str(r.get("prefill_tokens", MISSING)),
                str(r.get("generated_tokens", MISSING)),
                str(r.get("peak_kv_tokens", MISSING)),
                str(r.get("peak_running", MISSING)),
                fmt(r.get("cpu_s"), 1),
                fmt(r.get("manager_cpu_s"), 2),
                fmt(r.get("peer_cpu_s"), 1),
                fmt(r.get("others_cpu_s"), 1),
                fmt(r.get("steal_s"), 1),
                fmt(r.get("vllm_timings_ms", {}).get("e2e_ms"), 0),
            ]
        )
    return markdown(rows)


def markdown(rows: list[list[str]]) -> str:
    return "\n".join("| " + " | ".join(row) + " |" for row in rows) + "\n"


def render_markdown(results: dict[str, Any]) -> str:
    machine = results["machine"]
    load0, load1 = results["load_avg_start"], results["load_avg_end"]
    lines = [
        f"# Application benchmarks ({results['mode']} mode)",
        "",
        f"Commit {machine.get('commit') or 'unknown'}. Model {results['model']} ({results['dtype']}) on "
        f"{machine['cpu']}, {machine['num_cpus']} CPUs, torch "
        f"{machine['torch']} with {machine['torch_threads']} threads. Load average (1/5/15 min) "
        f"{' / '.join(f'{x:.2f}' for x in load0)} at the start, {' / '.join(f'{x:.2f}' for x in load1)} at the end "
        f"(the machine is shared). Wall time {results['wall_s'] / 60:.1f} min. Each figure is the median of its "
        "runs (column `runs`), with their range in parentheses when there are several: up to "
        f"{results.get('repeats', 1)}, interleaved (every configuration of a scenario, then the next scenario, then "
        "the next repeat in reverse configuration order) while the time budget allowed. Ratios are of medians.",
        "",
        "Times include the simulated network: a round trip (mean "
        f"{results['rtt_ms']['mean']:.0f} ms x {results['rtt_ms']['scale']:g}) per request-level call, one per "
        "Parrot submission. Ratios are baseline / Parrot (above 1: Parrot is faster). Every run's outputs were "
        "checked: the engine generated exactly the tokens the app's calls asked for (EOS ignored).",
        "",
    ]
    pairs = [h for i, j, h in ratio_columns(main_configs(results)) if j != 0]
    if pairs:
        lines += [f"Also {', '.join(pairs)}: a baseline against Parrot serving over that same engine.", ""]
    lines += [
        render_table(results),
    ]
    ablations = render_ablations(results)
    if ablations:
        lines += [
            "## Ablations (Parrot with one optimization off; ratio above 1: the optimization helps)",
            "",
            ablations,
        ]
    lines += ["## Profile (first run of each scenario)", "", render_profile(results)]
    lines += ["## Configurations", ""]
    lines += [f"- **{c['label']}**: {c['about']}" for c in results["configs"]]
    lines += ["", "Request-level clients: " + "; ".join(f"{k}: {v}" for k, v in results["clients"].items()), ""]
    if results["unavailable"]:
        lines += ["## Not available in this run", ""] + [f"- {u}" for u in results["unavailable"]] + [""]
    lines += ["## Scaling (the paper's shapes, shrunk for a 2-core CPU and a 135M model)", ""]
    lines += [f"- {s['label']}: {s['scaling']}" for s in results["scenarios"]]
    errors = [r for r in results["records"] if "error" in r]
    if errors:
        lines += ["", "## Failed runs", ""] + [f"- {r['scenario']} on {r['config']}: {r['error']}" for r in errors]
    return "\n".join(lines) + "\n"


# ---- plots ---------------------------------------------------------------------------------------

HATCHES = ("", "//", "\\\\", "xx", "..", "--", "++", "oo")


def write_plots(results: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []
    configs = main_configs(results)
    figures: dict[str, list[tuple[float, dict[str, Any]]]] = {}
    for s in results["scenarios"]:
        for fig_id, xlabel, x in s["plots"]:
            figures.setdefault(fig_id, []).append((x, s | {"xlabel": xlabel}))
    for fig_id, points in figures.items():
        points.sort(key=lambda p: p[0])
        metric = points[0][1]["metrics"][0]
        fig, ax = plt.subplots(figsize=(4.5, 3.2))
        for i, c in enumerate(configs):
            measured = [(x, value(results, s["key"], c["key"], metric["key"])) for x, s in points]
            xs = [x for x, v in measured if v is not None]
            ys = [v for _, v in measured if v is not None]
            if xs:
                ax.plot(xs, ys, marker="os^vD*"[i % 6], label=c["label"])
        ax.set_xlabel(points[0][1]["xlabel"])
        ax.set_ylabel(f"{metric['label']} ({metric['unit']})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, frameon=False)
        fig.tight_layout()
        path = out / f"{fig_id}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    unplotted = [s for s in results["scenarios"] if not s["plots"]]
    if unplotted:  # none when every scenario run has a figure of its own (e.g. --only gpts)
        written.append(_bars(plt, results, configs, out / "apps.png", unplotted))
    ablation_keys = {
        r["scenario"] for r in results["records"] if r["config"] in {c["key"] for c in ablation_configs(results)}
    }
    if ablation_keys:
        scenarios = [s for s in results["scenarios"] if s["key"] in ablation_keys]
        parrot = [c for c in results["configs"] if c["key"] == "parrot"]
        written.append(_bars(plt, results, parrot + ablation_configs(results), out / "ablations.png", scenarios))
    return written


def _bars(plt, results: dict[str, Any], configs: list[dict[str, Any]], path: Path, scenarios: list) -> Path:  # type: ignore[no-untyped-def]
    panels = [(s, m) for s in scenarios for m in s["metrics"]]
    cols = min(4, max(1, len(panels)))
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.8 * rows), squeeze=False)
    handles = {}
    for ax, (s, m) in zip(axes.flat, panels, strict=False):
        x = 0
        for i, c in enumerate(configs):
            v = value(results, s["key"], c["key"], m["key"])
            if v is None:  # not run here (an ablation that does not apply) or failed
                continue
            style = {"color": f"C{i}", "hatch": HATCHES[i % len(HATCHES)], "edgecolor": "black"}
            handles[c["label"]] = ax.bar(x, v, label=c["label"], **style)
            x += 1
        ax.set_title(s["label"], fontsize=8)
        ax.set_ylabel(f"{m['label']} ({m['unit']})", fontsize=7)
        ax.set_xticks([])
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.legend(
        list(handles.values()), list(handles), loc="upper center", ncol=min(len(handles), 5), fontsize=7, frameon=False
    )
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(results: dict[str, Any], out: Path) -> None:
    """results.json, results.md and the plots, in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    (out / "results.md").write_text(render_markdown(results))
    results["plots"] = [p.name for p in write_plots(results, out)]
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")


if __name__ == "__main__":  # re-render a run's table and plots: python -m benchmarks.apps.report DIR/results.json
    import sys

    path = Path(sys.argv[1])
    loaded = json.loads(path.read_text())
    loaded["derived"] = derive(loaded)
    write_report(loaded, path.parent)
    print(render_markdown(loaded))


def merge_into(results: dict[str, Any], earlier: dict[str, Any]) -> None:
    """Add `earlier`'s scenarios that this run did not run (their records and descriptions), in
    the earlier order; the run's own metadata stands, `merged_from` names what was kept."""
    ran = {s["key"] for s in results["scenarios"]}
    kept = [s for s in earlier["scenarios"] if s["key"] not in ran]
    results["scenarios"] = kept + results["scenarios"]
    results["records"] = [r for r in earlier["records"] if r["scenario"] not in ran] + results["records"]
    results["merged_from"] = {"commit": earlier.get("machine", {}).get("commit"), "scenarios": [s["key"] for s in kept]}
