"""docs/results.md and README.md's headline table are what bench_results/ gives (`make results`), and
bench_results/ holds only current result sets that say how they were measured."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks.results_page import (
    HEADLINE_END,
    HEADLINE_START,
    PAGE,
    README,
    RENDERERS,
    RESULTS,
    ResultSet,
    headline,
    load_sets,
    render_page,
    span,
    with_headline,
)

MANIFEST_KEYS = {"set", "benchmark", "command", "commit", "date", "machine"}


def test_the_results_page_is_what_the_result_sets_give() -> None:
    assert PAGE.read_text() == render_page(load_sets()), "docs/results.md is stale: run `make results`"


def test_the_readme_headline_table_is_what_the_result_sets_give() -> None:
    readme = README.read_text()
    assert readme == with_headline(readme, headline(load_sets())), "README.md's table is stale: run `make results`"


def test_every_result_set_says_how_it_was_measured() -> None:
    sets = load_sets()
    assert sets
    for s in sets:
        assert set(s.manifest) >= MANIFEST_KEYS, s.name
        assert s.manifest["set"] == s.name
        assert s.benchmark in RENDERERS, s.name
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", s.manifest["date"]), s.name
        assert s.manifest["command"].startswith("python "), s.name
        assert {"kind", "cpu", "cpu_features", "num_cpus", "torch", "gpu"} <= set(s.manifest["machine"]), s.name
        # Named by what it measures and on which machine; a set on a virtual clock, or of several
        # machines with one file each, names no machine.
        assert s.name.endswith(s.kind) or s.kind in ("virtual-clock", "several"), s.name


def test_bench_results_is_lean_and_named_by_what_it_measures() -> None:
    files = [p for p in RESULTS.rglob("*") if p.is_file() and "tmp" not in p.relative_to(RESULTS).parts]
    folders = [p for p in RESULTS.iterdir() if p.is_dir() and p.name != "tmp"]
    assert len(folders) <= 15
    assert sum(p.stat().st_size for p in files) <= 3 * 1024 * 1024
    for p in files:
        assert not re.search(r"_s\d", str(p.relative_to(RESULTS))), p


def test_with_headline_replaces_only_the_marked_block() -> None:
    text = f"# Title\n\n{HEADLINE_START}\nold table\n{HEADLINE_END}\n\nrest\n"
    assert with_headline(text, "| new |\n") == f"# Title\n\n{HEADLINE_START}\n| new |\n{HEADLINE_END}\n\nrest\n"
    with pytest.raises(SystemExit, match="headline"):
        with_headline("no markers here", "| new |\n")


def test_span_formats_a_range_of_ratios() -> None:
    assert span([]) == "—"
    assert span([1.234]) == "1.23x"
    assert span([2.0, 0.987, 1.5]) == "0.99-2.00x"


def test_a_folder_without_a_manifest_is_refused(tmp_path: Path) -> None:
    (tmp_path / "engine-amd-avx512").mkdir()
    with pytest.raises(SystemExit, match=r"manifest\.json"):
        load_sets(tmp_path)


def test_the_engine_renderer_reads_ratios_from_the_set(tmp_path: Path) -> None:
    folder = tmp_path / "engine-amd-avx512"
    folder.mkdir()
    manifest = {
        "set": folder.name,
        "benchmark": "engine",
        "command": "python -m benchmarks.engine",
        "commit": "abc1234",
        "date": "2026-12-05",
        "machine": {"kind": "amd-avx512", "cpu": "AMD EPYC", "cpu_features": ["avx512f"], "num_cpus": 2},
    }
    peer = {"prefill_tok_s": {"128": 100.0}, "decode_tok_s": {"1": 10.0}}
    engine = {
        "model": "m",
        "dtype": "bfloat16",
        "threads": 2,
        "native_kernels": "avx512_bf16",
        "peers": {"parrot": {"prefill_tok_s": {"128": 150.0}, "decode_tok_s": {"1": 25.0}}, "vllm": peer},
        "rounds": {"parrot": [{}, {}, {}]},
        "memory_bandwidth_gbs": 30.0,
        "decode_bandwidth_use": {"1": 0.5},
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    (folder / "engine.json").write_text(json.dumps(engine))
    [s] = load_sets(tmp_path)
    text = RENDERERS["engine"](s)
    assert "| prefill 128 tokens | 150 | 100 | 1.50x |" in text
    assert "| decode, batch 1 | 25 | 10 | 2.50x |" in text
    assert isinstance(s, ResultSet)
    table = headline([s])
    assert "| engine: prefill 128-2,048 tokens, Parrot / vLLM | 1.50x | — | — |" in table
