"""What a benchmark ran on: the commit, the CPU (with the features the engine's dtype and kernels
follow), torch and Python."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CLK_TCK = os.sysconf("SC_CLK_TCK")  # /proc's CPU-time unit (ticks a second)


def machine_info() -> dict[str, Any]:
    import torch

    cpu = platform.processor()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    from parrot.engine.cpu_features import cpu_flags

    return {
        "commit": commit(),
        "cpu": cpu,
        # What the engine's dtype and kernels follow (the same model name covers AVX2-only and
        # AVX512-BF16 EPYCs).
        "cpu_features": sorted(cpu_flags() & {"avx2", "avx512f", "avx512_bf16", "amx_bf16"}),
        "num_cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def commit() -> str | None:
    """The checkout's commit, `git describe --always --dirty` (a `-dirty` suffix: uncommitted
    changes ran), or $PARROT_COMMIT where it is set (a copy of the tree without its git folder);
    None where neither tells."""
    if (given := os.environ.get("PARROT_COMMIT")) is not None:
        return given
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        git = ["git", "describe", "--always", "--dirty"]
        return subprocess.run(git, cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    return None


def machine_cpu_s() -> tuple[float, float]:
    """(busy, stolen) CPU seconds of the whole machine since boot, every core together, from
    /proc/stat: busy is every state but idle and iowait (a container sees its host's counters, so
    other tenants' work counts here); stolen is the hypervisor's steal column, time a virtual core
    waited for a physical one. (0, 0) where /proc/stat is missing."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("cpu "):
                # user nice system idle iowait irq softirq steal (guest times are inside user)
                user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in line.split()[1:9])
                return (user + nice + system + irq + softirq) / CLK_TCK, steal / CLK_TCK
    return 0.0, 0.0


def _stat_fields(stat: Path) -> list[str]:
    """A /proc stat file's fields after the command (which may hold spaces): state, ppid, ...,
    utime and stime at 11 and 12."""
    return stat.read_text().rsplit(")", 1)[1].split()


def thread_cpu_s(name: str) -> float:
    """CPU seconds (user + system) used so far by this process's live Python thread `name` (a
    manager's server thread) and its worker pool (threads named `name-pool...`: ServerThread's),
    from each thread's CPU clock (nanoseconds; /proc's 10 ms ticks where there is none); 0 when
    none is running."""
    total = 0.0
    for thread in threading.enumerate():
        if thread.ident is None or not (thread.name == name or thread.name.startswith(f"{name}-pool")):
            continue
        try:
            total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (AttributeError, OSError):  # no per-thread clock here: the kernel's tick counts
            with contextlib.suppress(OSError, ValueError, IndexError):
                total += _cpu_s(_stat_fields(Path(f"/proc/self/task/{thread.native_id}/stat")))
    return total


def _cpu_s(fields: list[str]) -> float:
    """User + system CPU seconds of a /proc stat file's fields (a process's or a thread's)."""
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def descendants_cpu_s(pid: int | None = None) -> float:
    """CPU seconds (user + system) used so far by the live processes below `pid` (default: this
    process): a peer server such as vLLM and its engine-core process. Read from /proc; 0 elsewhere."""
    root = os.getpid() if pid is None else pid
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = _stat_fields(entry / "stat")
            parents[int(entry.name)] = int(fields[1])
            times[int(entry.name)] = _cpu_s(fields)
    below: set[int] = {root}
    grew = True
    while grew:  # a few rounds: the tree is shallow (server, its engine core)
        new = {p for p, parent in parents.items() if parent in below and p not in below}
        below |= new
        grew = bool(new)
    return sum(times[p] for p in below - {root} if p in times)
