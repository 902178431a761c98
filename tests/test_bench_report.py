"""The application benchmark's report (benchmarks/apps/report.py) on hand-built results: the
derived figures, the table (medians with their ranges, ratios, the paper's figure), the ablations
table and the plots."""

from __future__ import annotations

from pathlib import Path

from benchmarks.apps.report import derive, ratio, render_ablations, render_table, write_plots
from benchmarks.common.paper import load_paper_workloads

PAPER = load_paper_workloads()


def _results() -> dict:
    configs = [
        {"key": "parrot", "label": "Parrot", "ablation": False},
        {"key": "a", "label": "(a) latency", "ablation": False},
        {"key": "b", "label": "(b) throughput", "ablation": False},
        {"key": "no_x", "label": "Parrot w/o x", "ablation": True},
    ]
    metric = {"key": "jct_s", "label": "completion time", "unit": "s", "lower_is_better": True}
    norm = {"key": "norm_latency_ms", "label": "normalized latency", "unit": "ms/token", "lower_is_better": True}
    scenarios = [
        {
            "key": "chain",
            "workload": "chain_summary",
            "label": "chain",
            "paper_key": "chain_summary",
            "metrics": [metric],
            "plots": [],
        },
        {
            "key": "g1",
            "workload": "gpts",
            "label": "gpts 1",
            "paper_key": "gpts_serving",
            "metrics": [norm],
            "plots": [["gpts", "rate", 1.0]],
        },
        {
            "key": "g2",
            "workload": "gpts",
            "label": "gpts 2",
            "paper_key": "gpts_serving",
            "metrics": [norm],
            "plots": [["gpts", "rate", 2.0]],
        },
    ]
    records = [
        {"scenario": "chain", "config": "parrot", "metrics": {"jct_s": 4.0}},
        {"scenario": "chain", "config": "parrot", "metrics": {"jct_s": 5.0}},  # a slower repeat
        {"scenario": "chain", "config": "a", "metrics": {"jct_s": 6.0}},
        {"scenario": "chain", "config": "b", "error": "boom"},
        {"scenario": "chain", "config": "no_x", "metrics": {"jct_s": 5.0}},
        {"scenario": "g1", "config": "parrot", "metrics": {"norm_latency_ms": 100.0}},
        {"scenario": "g1", "config": "a", "metrics": {"norm_latency_ms": 150.0}},
        {"scenario": "g1", "config": "b", "metrics": {"norm_latency_ms": 120.0}},
        {"scenario": "g2", "config": "parrot", "metrics": {"norm_latency_ms": 140.0}},
        {"scenario": "g2", "config": "a", "metrics": {"norm_latency_ms": 400.0}},
        {"scenario": "g2", "config": "b", "metrics": {"norm_latency_ms": 190.0}},
    ]
    return {"configs": configs, "scenarios": scenarios, "records": records, "paper_results": PAPER["paper_results"]}


def test_table_shows_median_runs_with_their_range_ratios_and_the_papers_figure() -> None:
    results = _results()
    results["derived"] = derive(results)
    assert results["derived"] == {  # under 1.5 x 100 ms/token at every rate up to it
        "gpts_threshold_ms": 150.0,
        "gpts_rates": [1.0, 2.0],
        "gpts_sustainable_rate": {"parrot": 2.0, "a": 1.0, "b": 1.0},
    }
    lines = render_table(results).splitlines()
    assert lines[0] == (
        "| workload | metric | Parrot | (a) latency | (b) throughput | (a)/Parrot | (b)/Parrot | runs | paper |"
    )
    assert lines[2] == (  # Parrot's two runs: their median, and their range
        "| chain | completion time (s) | 4.50 (4.00-5.00) | 6.00 | — | 1.33x | — | 0 | "
        "1.18-1.38x vs vLLM; up to ~2.4-2.9x with background load |"
    )
    assert lines[3].startswith(
        "| gpts 1 | normalized latency (ms/token) | 100.00 | 150.00 | 120.00 | 1.50x | 1.20x | 1 |"
    )
    assert lines[5].startswith(
        "| GPTs serving | sustainable rate at <= 150 ms/token (req/s) | 2.00 | 1.00 | 1.00 | 2.00x | 2.00x | — |"
    )
    results["derived"]["gpts_sustainable_rate"]["a"] = 0.0  # over the threshold even at the lowest rate
    assert (
        render_table(results)
        .splitlines()[5]
        .startswith(
            "| GPTs serving | sustainable rate at <= 150 ms/token (req/s) | 2.00 | < 1 | 1.00 | > 2.00x | 2.00x |"
        )
    )
    assert render_ablations(results).splitlines()[2] == (
        "| chain | completion time (s) | Parrot w/o x | 4.50 | 5.00 | 1.11x |"
    )
    assert ratio(3.0, 1.5) == 2.0 and ratio(3.0, 1.5, lower_is_better=False) == 0.5 and ratio(None, 1.0) is None


def test_plots_when_every_scenario_has_a_figure_of_its_own(tmp_path: Path) -> None:
    results = _results()  # `--only gpts`: no scenario left for the bar panels (that crashed)
    results["scenarios"] = [s for s in results["scenarios"] if s["plots"]]
    results["records"] = [r for r in results["records"] if r["scenario"] != "chain"]
    assert [p.name for p in write_plots(results, tmp_path)] == ["gpts.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpts.png"]
    full = _results()  # with a scenario without a figure, the bars come too
    (tmp_path / "all").mkdir()
    assert [p.name for p in write_plots(full, tmp_path / "all")] == ["gpts.png", "apps.png", "ablations.png"]


def test_table_compares_vllm_with_parrot_over_vllm() -> None:
    results = _results()
    results["configs"].insert(3, {"key": "parrot_vllm", "label": "Parrot+vLLM", "ablation": False})
    results["configs"].insert(4, {"key": "d", "label": "(d) vLLM", "ablation": False})
    results["records"] += [
        {"scenario": "chain", "config": "parrot_vllm", "metrics": {"jct_s": 3.0}},
        {"scenario": "chain", "config": "d", "metrics": {"jct_s": 4.5}},
    ]
    lines = render_table(results).splitlines()
    assert lines[0].endswith("| Parrot+vLLM/Parrot | (d)/Parrot | (d)/Parrot+vLLM | runs | paper |")
    assert "| 4.50 (4.00-5.00) | 6.00 | — | 3.00 | 4.50 | 1.33x | — | 0.67x | 1.00x | 1.50x | 0 |" in lines[2]
