"""What one benchmark run cost the shared cores, beside its metric: CPU seconds in this process
(clients, the manager, builtin engines) and in its child processes (a peer server: vLLM's API
server and engine core), what the rest of the machine took meanwhile (other processes, other
tenants of a shared host, and the hypervisor's steal: a run slowed by a neighbour shows it), and
for runs on real vLLM its own mean times per request (its /metrics); for a configuration served by
Parrot's manager, the CPU of the manager's server thread and its worker pool (HTTP, the executor,
tokenizing batches, an OpenAI adapter's streams; a builtin engine's steps run on a thread of their
own, not counted here). The peer's CPU is that of the
child processes alive at both ends of the run (a long-lived server's): a child that exits during the
run, and the kernel's softirq time on the run's own loopback traffic, count as others'."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from benchmarks.common.machine import descendants_cpu_s, machine_cpu_s, thread_cpu_s
from benchmarks.peers.vllm_server import mean_timings_ms, request_timings


class RunCost:
    def __init__(self, vllm_url: str | None, manager_thread: str | None = None) -> None:
        self.vllm_url = vllm_url
        self.manager_thread = manager_thread
        self._manager_cpu = 0.0
        self._cpu = (0.0, 0.0)
        self._machine = (0.0, 0.0)
        self._timings: dict[str, tuple[float, float]] | None = None

    async def start(self) -> RunCost:
        if self.vllm_url:
            self._timings = await asyncio.to_thread(request_timings, self.vllm_url)
        if self.manager_thread is not None:  # next to this process's: the same window
            self._manager_cpu = thread_cpu_s(self.manager_thread)
        self._cpu = (time.process_time(), descendants_cpu_s())
        self._machine = machine_cpu_s()
        return self

    async def stop(self) -> dict[str, Any]:
        own = time.process_time() - self._cpu[0]
        manager = None if self.manager_thread is None else thread_cpu_s(self.manager_thread) - self._manager_cpu
        peer = descendants_cpu_s() - self._cpu[1]
        busy, stolen = machine_cpu_s()
        cost: dict[str, Any] = {
            "cpu_s": own,
            "peer_cpu_s": peer,
            # The machine's busy time less this run's own: /proc/stat counts in ticks (10 ms), so a
            # quiet machine reads a few ticks either side of zero, kept at zero.
            "others_cpu_s": max(0.0, busy - self._machine[0] - own - peer),
            "steal_s": stolen - self._machine[1],
        }
        if manager is not None:
            cost["manager_cpu_s"] = manager
        if self._timings is not None:  # vLLM's histograms observe each request once
            assert self.vllm_url is not None
            after = await asyncio.to_thread(request_timings, self.vllm_url)
            cost["vllm_timings_ms"] = mean_timings_ms(self._timings, after)
        return cost
