"""A result set: the folder one benchmark run writes (bench_results/<benchmark>-<machine kind>/)
and its manifest.json, which makes the folder self-describing: the benchmark, the command that
produced it, the commit, the date, and the machine it ran on.

    {"set": "engine-amd-avx512", "benchmark": "engine", "command": "python -m benchmarks.engine --quick",
     "commit": "3f2a1c9", "date": "2025-01-31", "machine": {"kind": "amd-avx512", "cpu": ..., "gpu": null}}

The machine kind names what the figures follow: the CPU's vendor and widest vector extension (the
engine's dtype and kernels follow it), or the GPU for a GPU benchmark.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from benchmarks.common.machine import commit, machine_info

RESULTS = Path("bench_results")
VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}
GPU_VENDORS = ("nvidia", "amd", "tesla", "geforce", "radeon", "instinct")


def cpu_kind(cpuinfo: str) -> str:
    """The kind of CPU a /proc/cpuinfo text describes (its first processor): `intel-amx` with AMX
    bf16 tiles, else `<vendor>-avx512` (AVX512-BF16 or AVX512F), `<vendor>-avx2`, `<vendor>-generic`;
    vendor `intel`, `amd`, or `cpu` for any other."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor's block is read
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    vendor = VENDORS.get(fields.get("vendor_id", ""), "cpu")
    flags = set(fields.get("flags", "").split())
    if "amx_bf16" in flags:
        return "intel-amx"
    if flags & {"avx512_bf16", "avx512f"}:
        return f"{vendor}-avx512"
    if "avx2" in flags:
        return f"{vendor}-avx2"
    return f"{vendor}-generic"


def gpu_kind(device_name: str) -> str:
    """`gpu-<model>` from a CUDA device name: its first word with a digit, vendor words left out
    ("NVIDIA H200" -> gpu-h200, "NVIDIA A100-SXM4-80GB" -> gpu-a100)."""
    words = [w for w in device_name.lower().split() if w not in GPU_VENDORS]
    model = next((w for w in words if any(c.isdigit() for c in w)), words[0] if words else "unknown")
    return "gpu-" + model.split("-")[0]


def read_cpuinfo() -> str:
    with contextlib.suppress(OSError):
        return Path("/proc/cpuinfo").read_text()
    return ""


def gpu_name() -> str | None:
    """The CUDA device's name, None without one (or without torch)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def machine_kind(gpu: bool = False, cpuinfo: str | None = None) -> str:
    """This machine's kind: its GPU's (`gpu=True`, a GPU benchmark) or its CPU's (`cpuinfo`, default
    /proc/cpuinfo)."""
    if gpu:
        name = gpu_name()
        if name is None:
            raise RuntimeError("a GPU benchmark's machine kind, but no CUDA device")
        return gpu_kind(name)
    return cpu_kind(read_cpuinfo() if cpuinfo is None else cpuinfo)


def default_out(benchmark: str, gpu: bool = False) -> Path:
    """Where a run of `benchmark` writes by default: bench_results/<benchmark>-<machine kind>."""
    return RESULTS / f"{benchmark}-{machine_kind(gpu)}"


def main_module() -> str:
    """The module this process runs as `python -m` (a package's, not its `__main__`'s)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is None:
        raise RuntimeError("not run as `python -m MODULE`: name the module")
    return str(spec.name).removesuffix(".__main__")


def command(argv: list[str] | None = None, module: str | None = None) -> str:
    """The command that reruns this process: `python -m <module> <args>`, quoted for a shell."""
    args = (sys.argv if argv is None else argv)[1:]
    return shlex.join(["python", "-m", module or main_module(), *args])


def today() -> str:
    return datetime.datetime.now(datetime.UTC).date().isoformat()


def manifest(
    out_dir: Path, benchmark: str, *, gpu: bool = False, argv: list[str] | None = None, module: str | None = None
) -> dict[str, Any]:
    info = machine_info()
    info.pop("commit", None)  # the manifest's own field
    kind = machine_kind(gpu)
    return {
        "set": Path(out_dir).name,
        "benchmark": benchmark,
        "command": command(argv, module),
        "commit": commit(),
        "date": today(),
        "machine": {"kind": kind, **info, "gpu": gpu_name()},
    }


def write_manifest(
    out_dir: Path, benchmark: str, *, gpu: bool = False, argv: list[str] | None = None, module: str | None = None
) -> dict[str, Any]:
    """Write `out_dir`/manifest.json for a run of `benchmark` (see the module docstring); returns it.
    `argv` and `module` default to this process's (`sys.argv`, the module run with `-m`)."""
    data = manifest(out_dir, benchmark, gpu=gpu, argv=argv, module=module)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "manifest.json").write_text(json.dumps(data, indent=1) + "\n")
    return data
