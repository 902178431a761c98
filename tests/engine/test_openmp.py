"""The engine's OpenMP workers (parrot/engine/openmp.py): the wait policy set before torch loads,
start-up's torch work on a thread that ends, so a serving process keeps one team of workers, and a
loop thread that ends when its engine is idle, so an idle engine keeps none."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from parrot.engine import llm_engine, sync_client
from parrot.engine.config import EngineConfig
from parrot.engine.openmp import SPIN_COUNT, on_passing_thread, passing_thread, prefer_spinning
from parrot.protocol import ExtendRequest, SamplingParams


def test_the_wait_policy_is_set_only_when_nobody_chose_one_and_torch_is_not_loaded() -> None:
    env: dict[str, str] = {}
    assert prefer_spinning(env, modules={})
    assert env == {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": SPIN_COUNT}
    chosen = {"OMP_WAIT_POLICY": "PASSIVE"}
    assert not prefer_spinning(chosen, modules={})
    assert chosen == {"OMP_WAIT_POLICY": "PASSIVE"}
    counted = {"GOMP_SPINCOUNT": "1000"}
    assert not prefer_spinning(counted, modules={})
    assert counted == {"GOMP_SPINCOUNT": "1000"}
    late: dict[str, str] = {}
    assert not prefer_spinning(late, modules={"torch": object()})  # libgomp has read its variables
    assert late == {}


def test_importing_the_engine_sets_it_before_torch_loads() -> None:
    code = "import os, parrot.engine, torch; print(os.environ['OMP_WAIT_POLICY'], os.environ['GOMP_SPINCOUNT'])"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["ACTIVE", SPIN_COUNT]
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    code = "import os, parrot.engine; print(os.environ['OMP_WAIT_POLICY'], 'GOMP_SPINCOUNT' in os.environ)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["PASSIVE", "False"]


def test_a_passing_thread_returns_the_result_and_raises_the_error_here() -> None:
    names: list[str] = []

    def work() -> int:
        names.append(threading.current_thread().name)
        return 7

    assert on_passing_thread(work) == 7
    assert names == ["parrot-engine-setup"]
    assert all(t.name != "parrot-engine-setup" for t in threading.enumerate())  # it ended

    def fail() -> int:
        raise FileNotFoundError("no model here")

    with pytest.raises(FileNotFoundError, match="no model here"):
        on_passing_thread(fail)


# Subprocess code: wait (up to 10 s) until the process has no more threads than `before`.
BACK_TO_BEFORE = (
    "deadline = time.monotonic() + 10\n"
    "while len(os.listdir('/proc/self/task')) > before and time.monotonic() < deadline:\n"
    "    time.sleep(0.02)\n"
)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="threads are counted in /proc")
def test_building_an_engine_leaves_no_openmp_workers_behind(default_model_folder: Path) -> None:
    # A fresh process: in this one earlier tests already ran torch on the main thread. Loading a
    # model on the main thread would leave a team of OpenMP workers there for the process's life.
    code = (
        "import os, time, torch\n"
        "from parrot.engine.config import EngineConfig\n"
        "from parrot.engine.llm_engine import LLMEngine\n"
        "torch.set_num_threads(2)\n"
        "before = len(os.listdir('/proc/self/task'))\n"
        f"engine = LLMEngine(EngineConfig(model={str(default_model_folder)!r}, num_threads=2, num_blocks=64))\n"
        f"{BACK_TO_BEFORE}"  # a passing thread's workers end soon after it
        "print(before, len(os.listdir('/proc/self/task')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    before, after = (int(n) for n in out.stdout.split()[-2:])
    assert after == before


def test_a_method_on_a_passing_thread_sets_up_its_object() -> None:
    class Built:
        @passing_thread
        def __init__(self, n: int) -> None:
            self.n = n
            self.thread = threading.current_thread().name

    built = Built(3)
    assert built.n == 3
    assert built.thread == "parrot-engine-setup"


def test_the_thread_count_set_on_a_passing_thread_holds_on_the_caller_s_thread() -> None:
    # The caller has run a parallel op with 2 threads (libgomp keeps that count per thread);
    # a count set during start-up on the passing thread must reach it anyway.
    code = (
        "import torch\nfrom parrot.engine.openmp import on_passing_thread\n"
        "torch.set_num_threads(2); torch.ones(512, 512) @ torch.ones(512, 512)\n"
        "on_passing_thread(lambda: torch.set_num_threads(1))\nprint(torch.get_num_threads())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["1"]


def test_benchmark_processes_set_the_wait_policy_before_torch_loads() -> None:
    # benchmarks.engine.throughput imports torch at its top; the package's own import comes first.
    code = "import os, benchmarks.engine.throughput; print(os.environ.get('OMP_WAIT_POLICY'))"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["ACTIVE"]


def wait_until(cond: object, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.01)
    return bool(cond())  # type: ignore[operator]


def test_an_idle_loop_thread_ends_beside_another_engine_and_the_next_request_starts_another(
    tiny_model_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(llm_engine, "IDLE_EXIT_S", 0.05)
    cfg = EngineConfig(model=str(tiny_model_folder), dtype="float32", num_blocks=64)
    engine, other = llm_engine.LLMEngine(cfg), llm_engine.LLMEngine(cfg)
    engine.start()
    try:
        sync_client.extend_only(engine, ExtendRequest(context_id="a", token_ids=[5, 6, 7, 8]))
        first = engine._thread
        assert first is not None
        time.sleep(0.3)  # alone in the process: an idle engine keeps its thread (no restart to pay)
        assert engine._thread is first and first.is_alive()
        other.start()  # another engine started: the idle one's thread (and its team) goes
        assert wait_until(lambda: engine._thread is None and not first.is_alive())
        with pytest.raises(RuntimeError, match="loop thread stopped"):
            engine.step()  # started: the loop owns the steps even while no thread runs
        req = ExtendRequest(context_id="a", append=True, sampling=SamplingParams(max_tokens=3, ignore_eos=True))
        events = sync_client.wait(sync_client.submit(engine, req), timeout=30)
        assert [e.finish_reason for e in events] == [None, None, "length"]
        assert engine._thread is not first
        assert wait_until(lambda: engine._thread is None)
    finally:
        engine.stop()
        other.stop()
    assert engine._thread is None
    engine.start()  # stopped and started again: it serves, and alone it keeps its thread
    try:
        req = ExtendRequest(context_id="a", append=True, sampling=SamplingParams(max_tokens=2, ignore_eos=True))
        events = sync_client.wait(sync_client.submit(engine, req), timeout=30)
        assert [e.finish_reason for e in events] == [None, "length"]
        time.sleep(0.3)
        assert engine._thread is not None and engine._thread.is_alive()
    finally:
        engine.stop()


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="threads are counted in /proc")
def test_an_idle_engine_keeps_no_openmp_team_in_the_process(default_model_folder: Path) -> None:
    # Two engines in one process: once the second is idle, its loop thread and that thread's team
    # of OpenMP workers are gone (an idle team makes the other engine's steps ~2x slower).
    code = (
        "import os, time, torch\n"
        "from parrot.engine import sync_client, llm_engine\n"
        "from parrot.engine.config import EngineConfig\n"
        "from parrot.protocol import ExtendRequest\n"
        "llm_engine.IDLE_EXIT_S = 0.05\n"
        "torch.set_num_threads(2)\n"
        f"cfg = EngineConfig(model={str(default_model_folder)!r}, num_threads=2, num_blocks=64)\n"
        "engines = [llm_engine.LLMEngine(cfg) for _ in range(2)]\n"
        "time.sleep(0.5)\n"
        "before = len(os.listdir('/proc/self/task'))\n"
        "for i, e in enumerate(engines):\n"
        "    e.start()\n"
        "    sync_client.extend_only(e, ExtendRequest(context_id='c', token_ids=list(range(100, 164))))\n"
        "busy = len(os.listdir('/proc/self/task'))\n"
        f"{BACK_TO_BEFORE}"
        "print(before, busy, len(os.listdir('/proc/self/task')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    before, busy, after = (int(n) for n in out.stdout.split()[-3:])
    assert busy > before  # the loop threads ran (with their workers)
    assert after == before
