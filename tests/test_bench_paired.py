"""The paired reading of benchmark runs (benchmarks/apps/paired.py) on hand-built results: exact figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.apps.paired import collect, render, sign_test_p, versions, write_paired

LATENCY = {"key": "lat", "label": "latency", "unit": "ms", "lower_is_better": True}
RATE = {"key": "rate", "label": "rate", "unit": "req/s", "lower_is_better": False}


def record(config: str, repeat: int, lat: float, rate: float, itl: float | None = None, **kw: Any) -> dict[str, Any]:
    r: dict[str, Any] = {"scenario": "s", "config": config, "repeat": repeat, "metrics": {"lat": lat, "rate": rate}}
    if itl is not None:
        r["vllm_timings_ms"] = {"itl_ms": itl}
    return r | kw


def results(*records: dict[str, Any]) -> dict[str, Any]:
    scenario = {"key": "s", "label": "S", "workload": "w", "metrics": [LATENCY, RATE]}
    return {"scenarios": [scenario], "records": list(records)}


def test_the_sign_test_is_two_sided_and_exact() -> None:
    assert [sign_test_p(0, 0), sign_test_p(3, 3), sign_test_p(0, 3)] == [1.0, 0.25, 0.25]
    assert sign_test_p(1, 9) == pytest.approx(2 * 10 / 512)
    assert sign_test_p(5, 10) == 1.0


def test_repeats_pair_up_by_scenario_and_repeat_and_pool_over_files() -> None:
    first = results(
        record("d", 0, 100.0, 4.0, itl=50.0),
        record("p", 0, 110.0, 5.0, itl=55.0),
        record("d", 1, 90.0, 4.0),
        record("p", 1, 90.0, 2.0),
        record("p", 2, 80.0, 2.0),  # no baseline in this repeat: no pair
        record("d", 3, 80.0, 2.0),
        record("p", 3, 1.0, 9.0, error="checks failed"),  # failed: no pair
    )
    second = results(record("p", 0, 50.0, 1.0, itl=40.0), record("d", 0, 60.0, 1.0, itl=40.0))
    pairs = collect([first, second], "d", "p", None)
    lat, rate = pairs["s / lat"], pairs["s / rate"]
    # Times: baseline / other (above 1: the other is faster); rates: other / baseline.
    assert lat.ratios == pytest.approx([100 / 110, 1.0, 60 / 50])
    assert rate.ratios == pytest.approx([5 / 4, 2 / 4, 1.0])
    assert lat.itl_ratios == pytest.approx([50 / 55, None, 1.0])
    assert collect([first], "d", "p", ["other"]) == {}


def test_the_table_shows_median_range_wins_and_what_vllms_own_decode_explains() -> None:
    pairs = collect(
        [results(record("d", 0, 100.0, 1.0, itl=50.0), record("p", 0, 110.0, 1.0, itl=55.0))], "d", "p", None
    )
    lines = render(pairs, "d", "p").splitlines()
    head = "| scenario: metric | pairs | d vs p: median ratio (range) | won / tied / lost | sign test p |"
    assert lines[0] == head + " vLLM ITL | rest |"
    # vLLM's own time per token explains the whole difference: the rest is 1.0. A tie is left out
    # of the sign test (no pair won or lost: p = 1).
    assert lines[2] == "| S: latency (ms) | 1 | 0.909x (0.909-0.909) | 0 / 0 / 1 | 1 | 0.909x | 1.000x |"
    assert lines[3] == "| S: rate (req/s) | 1 | 1.000x (1.000-1.000) | 0 / 1 / 0 | 1 | 0.909x | 1.100x |"


def test_the_command_reads_results_files_and_refuses_runs_without_pairs(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results(record("d", 0, 100.0, 1.0), record("p", 0, 50.0, 1.0))))
    cmd = [sys.executable, "-m", "benchmarks.apps.paired", str(path), "--config", "p"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert "| S: latency (ms) | 1 | 2.000x (2.000-2.000) | 1 / 0 / 0 | 1 | — | — |" in done.stdout
    refused = subprocess.run([*cmd[:-1], "other"], capture_output=True, text=True)
    assert refused.returncode == 2 and "no repeat ran both d and other" in refused.stderr


def test_a_run_writes_its_same_engine_pairs_and_nothing_without_them(tmp_path: Path) -> None:
    run = results(record("d", 0, 100.0, 1.0), record("parrot_vllm", 0, 50.0, 1.0), record("parrot", 0, 40.0, 1.0))
    write_paired(run, tmp_path)
    text = (tmp_path / "paired.md").read_text()
    assert text.startswith("## d against parrot_vllm, repeat by repeat\n\n| scenario: metric |")
    assert "| S: latency (ms) | 1 | 2.000x (2.000-2.000) | 1 / 0 / 0 | 1 | — | — |" in text
    write_paired(results(record("parrot", 0, 40.0, 1.0)), tmp_path)  # no pair: no table, not the old one
    assert not (tmp_path / "paired.md").exists()


def test_two_versions_of_the_code_pair_run_by_run_and_repeat_by_repeat() -> None:
    before = [
        results(record("parrot", 0, 100.0, 4.0), record("parrot", 1, 80.0, 4.0), record("a", 0, 1.0, 1.0)),
        results(record("parrot", 0, 90.0, 2.0)),
    ]
    after = [
        results(record("parrot", 0, 50.0, 8.0), record("parrot", 1, 80.0, 2.0)),
        results(record("parrot", 0, 100.0, 2.0)),
    ]
    pairs = collect(versions(before, after, "parrot"), "before", "after", None)
    # Above 1: the later version is faster (times) or higher (rates); the other configuration is left out.
    assert pairs["s / lat"].ratios == pytest.approx([2.0, 1.0, 0.9])
    assert pairs["s / rate"].ratios == pytest.approx([2.0, 0.5, 1.0])
    with pytest.raises(ValueError, match="one to one"):
        versions(before, after[:1], "parrot")
