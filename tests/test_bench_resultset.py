"""Result sets (benchmarks/common/resultset.py): the machine kind read from /proc/cpuinfo's text or a
CUDA device's name, a run's default folder, and the manifest.json it writes, exactly."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import types
from pathlib import Path

import pytest

from benchmarks.common import resultset
from benchmarks.common.resultset import cpu_kind, default_out, gpu_kind, machine_kind, write_manifest


def cpuinfo(vendor: str, flags: str, processors: int = 2) -> str:
    block = f"processor\t: {{}}\nvendor_id\t: {vendor}\nmodel name\t: Some CPU\nflags\t\t: fpu sse2 {flags}\n"
    return "\n".join(block.format(i) for i in range(processors)) + "\n"


AMD_AVX512 = cpuinfo("AuthenticAMD", "avx avx2 avx512f avx512bw avx512_bf16")
MACHINE = {
    "commit": "ignored",
    "cpu": "AMD EPYC 9R14",
    "cpu_features": ["avx2", "avx512_bf16", "avx512f"],
    "num_cpus": 2,
    "torch": "2.5.1+cpu",
}


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        (AMD_AVX512, "amd-avx512"),
        (cpuinfo("GenuineIntel", "avx2 avx512f avx512_bf16 amx_bf16 amx_tile"), "intel-amx"),
        (cpuinfo("GenuineIntel", "avx2 avx512f"), "intel-avx512"),
        (cpuinfo("AuthenticAMD", "avx avx2 fma"), "amd-avx2"),
        (cpuinfo("HygonGenuine", "avx2"), "cpu-avx2"),
        (cpuinfo("GenuineIntel", "sse4_2"), "intel-generic"),
        ("", "cpu-generic"),
    ],
)
def test_the_cpu_kind_follows_vendor_and_widest_vector_extension(text: str, kind: str) -> None:
    assert cpu_kind(text) == kind
    assert machine_kind(cpuinfo=text) == kind


def test_the_cpu_kind_reads_the_first_processor_only() -> None:
    first = cpuinfo("AuthenticAMD", "avx2", processors=1)
    second = cpuinfo("AuthenticAMD", "avx2 avx512f avx512_bf16", processors=1).replace(
        "processor\t: 0", "processor\t: 1"
    )
    assert cpu_kind(first + "\n" + second) == "amd-avx2"


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("NVIDIA H200", "gpu-h200"),
        ("NVIDIA H100 80GB HBM3", "gpu-h100"),
        ("NVIDIA A100-SXM4-80GB", "gpu-a100"),
        ("NVIDIA GeForce RTX 4090", "gpu-4090"),
        ("AMD Instinct MI300X", "gpu-mi300x"),
    ],
)
def test_the_gpu_kind_is_the_device_model(name: str, kind: str) -> None:
    assert gpu_kind(name) == kind


@pytest.fixture
def amd_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resultset, "read_cpuinfo", lambda: AMD_AVX512)
    monkeypatch.setattr(resultset, "machine_info", lambda: dict(MACHINE))
    monkeypatch.setattr(resultset, "commit", lambda: "3f2a1c9-dirty")
    monkeypatch.setattr(resultset, "today", lambda: "2025-01-31")
    monkeypatch.setattr(resultset, "gpu_name", lambda: None)


@pytest.mark.usefixtures("amd_machine")
def test_a_run_defaults_to_a_folder_named_after_its_benchmark_and_machine_kind() -> None:
    assert default_out("apps-vllm") == Path("bench_results/apps-vllm-amd-avx512")
    assert default_out("engine") == Path("bench_results/engine-amd-avx512")
    with pytest.raises(RuntimeError) as e:
        default_out("attention", gpu=True)
    assert str(e.value) == "a GPU benchmark's machine kind, but no CUDA device"


@pytest.mark.usefixtures("amd_machine")
def test_the_manifest_names_the_set_benchmark_command_commit_date_and_machine(tmp_path: Path) -> None:
    out = tmp_path / "engine-amd-avx512"
    argv = ["/repo/benchmarks/engine/__main__.py", "--quick", "--out", "my results"]
    written = write_manifest(out, "engine", argv=argv, module="benchmarks.engine")
    expected = {
        "set": "engine-amd-avx512",
        "benchmark": "engine",
        "command": "python -m benchmarks.engine --quick --out 'my results'",
        "commit": "3f2a1c9-dirty",
        "date": "2025-01-31",
        "machine": {
            "kind": "amd-avx512",
            "cpu": "AMD EPYC 9R14",
            "cpu_features": ["avx2", "avx512_bf16", "avx512f"],
            "num_cpus": 2,
            "torch": "2.5.1+cpu",
            "gpu": None,
        },
    }
    assert written == expected
    assert json.loads((out / "manifest.json").read_text()) == expected


@pytest.mark.usefixtures("amd_machine")
def test_a_gpu_benchmarks_manifest_names_the_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resultset, "gpu_name", lambda: "NVIDIA H200")
    assert default_out("attention", gpu=True) == Path("bench_results/attention-gpu-h200")
    written = write_manifest(tmp_path / "attention-gpu-h200", "attention-gpu", gpu=True, argv=["x"], module="m")
    assert (written["set"], written["benchmark"], written["command"]) == (
        "attention-gpu-h200",
        "attention-gpu",
        "python -m m",
    )
    assert (written["machine"]["kind"], written["machine"]["gpu"]) == ("gpu-h200", "NVIDIA H200")


def test_the_command_is_the_module_run_with_dash_m_and_this_process_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    main = types.SimpleNamespace(__spec__=types.SimpleNamespace(name="benchmarks.apps.__main__"))
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setattr(sys, "argv", ["/repo/benchmarks/apps/__main__.py", "--only", "gpts", "--with-vllm"])
    assert resultset.command() == "python -m benchmarks.apps --only gpts --with-vllm"
    monkeypatch.setitem(sys.modules, "__main__", types.SimpleNamespace(__spec__=None))
    with pytest.raises(RuntimeError) as e:
        resultset.command()
    assert str(e.value) == "not run as `python -m MODULE`: name the module"


def test_a_benchmark_run_writes_its_manifest_beside_its_results(tmp_path: Path) -> None:
    """The manager at scale on the simulator, 2 engines and 10 apps (seconds), as a user runs it."""
    out = tmp_path / "scale"
    cmd = [sys.executable, "-m", "benchmarks.sim.scale", "--engines", "2", "--apps", "10", "--out", str(out)]
    subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], capture_output=True, check=True, timeout=300)
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "results.json", "results.md"]
    assert manifest["set"] == "scale"
    assert manifest["benchmark"] == "sim-scale"
    assert manifest["command"] == f"python -m benchmarks.sim.scale --engines 2 --apps 10 --out {shlex.quote(str(out))}"
    assert manifest["machine"]["kind"] == machine_kind()
    assert list(manifest) == ["set", "benchmark", "command", "commit", "date", "machine"]
