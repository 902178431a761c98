"""What a benchmark run cost the shared cores (benchmarks/apps/run_cost.py): CPU of this process and of
its children, and real vLLM's own request timings read from its /metrics page."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from benchmarks.apps import run_cost
from benchmarks.apps.run_cost import RunCost
from benchmarks.common.machine import descendants_cpu_s, machine_cpu_s, thread_cpu_s
from benchmarks.peers.vllm_server import mean_timings_ms, parse_request_timings
from parrot.web.server_thread import ServerThread


def test_child_processes_cpu_is_counted_apart_from_this_process() -> None:
    burn = (
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
        "print('done', flush=True)\ntime.sleep(30)"
    )
    before = descendants_cpu_s()
    child = subprocess.Popen([sys.executable, "-c", burn], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "done\n"
        assert descendants_cpu_s() - before >= 0.25
    finally:
        child.kill()
        child.wait(timeout=10)


def test_vllm_request_timings_are_read_from_its_metrics_page() -> None:
    page = "\n".join(
        [
            "# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.",
            'vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0"} 1.0',
            'vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 3.0',
            'vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 2.0',
            'vllm:e2e_request_latency_seconds_sum{engine="1",model_name="m"} 1.0',
            'vllm:e2e_request_latency_seconds_count{engine="1",model_name="m"} 2.0',
            'vllm:inter_token_latency_seconds_sum{engine="0"} 0.5',
            'vllm:inter_token_latency_seconds_count{engine="0"} 10.0',
            'vllm:request_queue_time_seconds_created{engine="0"} 1.7e9',
        ]
    )
    before = parse_request_timings(page)
    e2e_sum, e2e_count = before["vllm:e2e_request_latency_seconds"]  # summed over the engines' labels
    assert e2e_sum == 4.0
    assert e2e_count == 4.0
    itl_sum, itl_count = before["vllm:inter_token_latency_seconds"]
    assert itl_sum == 0.5
    assert itl_count == 10.0
    queue_sum, queue_count = before["vllm:request_queue_time_seconds"]  # only a _created line: nothing
    assert queue_sum == 0.0
    assert queue_count == 0.0
    after = dict(before)
    after["vllm:e2e_request_latency_seconds"] = (7.0, 6.0)  # two more requests, 3 s in all
    after["vllm:inter_token_latency_seconds"] = (0.5, 10.0)  # nothing observed: no mean
    assert mean_timings_ms(before, after) == {"e2e_ms": 1500.0}


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="the machine's counters are Linux's /proc/stat")
def test_the_machine_s_busy_and_stolen_time_only_grow() -> None:
    busy, stolen = machine_cpu_s()
    assert busy > 0.0  # this process has run
    t = time.process_time()
    while time.process_time() - t < 0.2:  # busy here counts in the machine's busy time
        pass
    busy_after, stolen_after = machine_cpu_s()
    assert busy_after - busy >= 0.15
    assert stolen_after >= stolen


def test_a_run_s_cost_is_the_machine_s_busy_time_less_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    def run(machine: list[tuple[float, float]], own: list[float], peer: list[float]) -> dict[str, object]:
        readings, cpu, children = iter(machine), iter(own), iter(peer)  # at start, then at stop
        monkeypatch.setattr(run_cost, "machine_cpu_s", lambda: next(readings))
        monkeypatch.setattr(run_cost, "descendants_cpu_s", lambda: next(children))
        monkeypatch.setattr(run_cost.time, "process_time", lambda: next(cpu))

        async def measure() -> dict[str, object]:
            cost = await RunCost(None).start()
            return await cost.stop()

        return asyncio.run(measure())

    # The machine was busy 3.5 s: 1.0 this process, 1.5 the peer, 1.0 someone else; 0.25 s stolen.
    cost = run([(100.0, 5.0), (103.5, 5.25)], [10.0, 11.0], [2.0, 3.5])
    assert cost == {"cpu_s": 1.0, "peer_cpu_s": 1.5, "others_cpu_s": 1.0, "steal_s": 0.25}
    # /proc/stat's 10 ms ticks can read less than the run's own time: nobody else, not less than 0.
    cost = run([(100.0, 5.0), (102.25, 5.0)], [10.0, 11.0], [2.0, 3.5])
    assert cost == {"cpu_s": 1.0, "peer_cpu_s": 1.5, "others_cpu_s": 0.0, "steal_s": 0.0}


def test_a_parrot_run_counts_its_manager_threads_cpu_apart() -> None:
    burned, stop = threading.Event(), threading.Event()

    def loop(seconds: float) -> None:  # a manager's event loop, or its pool: CPU while measured
        t = time.thread_time()
        while time.thread_time() - t < seconds:
            pass
        burned.set()
        stop.wait()

    name = "bench-manager-under-test"
    threads = [
        threading.Thread(target=loop, args=(0.3,), name=name, daemon=True),
        threading.Thread(target=loop, args=(0.1,), name=f"{name}-pool_0", daemon=True),  # ServerThread's pool
        threading.Thread(target=loop, args=(0.1,), name=f"{name}x", daemon=True),  # another thread
    ]

    async def measure() -> dict[str, object]:
        cost = await RunCost(None, name).start()
        for thread in threads:
            thread.start()
            assert await asyncio.to_thread(burned.wait, 30)  # however loaded the machine
            burned.clear()
        return await cost.stop()

    try:
        cost = asyncio.run(measure())
    finally:
        stop.set()
        for thread in threads:
            thread.join(5)
    assert 0.4 <= cost["manager_cpu_s"] < 0.45 <= cost["cpu_s"]  # type: ignore[operator]
    assert thread_cpu_s("no-such-thread") == 0.0

    async def without() -> dict[str, object]:
        return await (await RunCost(None).start()).stop()

    assert "manager_cpu_s" not in asyncio.run(without())  # a request-level configuration


def test_a_server_threads_workers_are_named_after_it() -> None:
    app = FastAPI()

    @app.get("/worker")
    async def worker() -> str:
        return await asyncio.to_thread(lambda: threading.current_thread().name)

    with ServerThread(app, name="bench-named") as server:
        assert httpx.get(f"{server.url}/worker", timeout=30).json().startswith("bench-named-pool")
