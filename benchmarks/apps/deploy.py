"""Serving configurations for the application benchmarks: live endpoints on loopback, in this process.

A `ManagerServer` is a manager over one engine with its HTTP app served by uvicorn on a background
thread (lifespan on, so the manager starts and stops with the server). `LocalServer` owns a
builtin engine; `UpstreamServer`'s engine is an OpenAI-compatible server (real vLLM) through the
manager's adapter (parrot/serve/openai_engine.py): Parrot over vLLM. `KvMonitor` samples the
engine's stats while a workload runs (peak KV blocks, tokens generated). The probes ask an
endpoint what it supports (`ignore_eos` on the OpenAI routes, prefix reuse).
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx

from parrot.backends.connect import connect_engine
from parrot.backends.openai_engine import OpenAIEngineClient
from parrot.engine.async_engine import AsyncEngine
from parrot.engine.config import EngineConfig
from parrot.launch import OpenAIUpstream
from parrot.protocol.engine_api import EngineStats
from parrot.protocol.engine_client import EngineClient
from parrot.serve import ManagerConfig, create_app, create_manager
from parrot.serve.manager import Manager
from parrot.web.server_thread import ServerThread

API_KEY = "bench"


@dataclass(frozen=True)
class ServerSpec:
    name: str
    engine: EngineConfig
    manager: ManagerConfig


@dataclass(frozen=True)
class UpstreamSpec:
    """A manager whose one engine is an OpenAI-compatible upstream (real vLLM), through the adapter."""

    name: str
    upstream: OpenAIUpstream
    manager: ManagerConfig


class ManagerServer:
    """A manager over one engine, served on 127.0.0.1 (an OS-picked port) while started."""

    kv_reported = True  # whether stats() counts the engine's own KV blocks
    # KvMonitor's sampling period: a builtin engine's running sequences change every step (tens
    # of ms); an upstream's only as requests come and go.
    monitor_interval_s = 0.05

    def __init__(self, name: str, manager: ManagerConfig) -> None:
        self.name = name
        self.manager_config = manager
        self._server: ServerThread | None = None
        self.manager: Manager | None = None
        self.url = ""

    @property
    def model(self) -> str:
        raise NotImplementedError

    def _engine(self) -> EngineClient:
        """Started and ready for the manager."""
        raise NotImplementedError

    def _stop_engine(self) -> None:
        return None

    def stats(self) -> EngineStats:
        """The engine's stats, read from another thread than the manager's."""
        raise NotImplementedError

    def start(self, timeout_s: float = 120.0) -> ManagerServer:
        manager = self.manager = create_manager([self._engine()], config=self.manager_config)
        self._server = ServerThread(
            create_app(manager, connect_engine=connect_engine), graceful_shutdown_s=5, name=self.thread_name
        )
        try:
            self._server.start(timeout=timeout_s)
        except RuntimeError as e:
            self._stop_engine()
            raise RuntimeError(f"server {self.name} did not start") from e
        self.url = self._server.url
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
        self._stop_engine()

    @property
    def thread_name(self) -> str:
        """The name of the thread that runs the manager's event loop (its CPU: RunCost)."""
        return f"bench-{self.name}"

    def latency_cap(self) -> int | None:
        """The manager's latency cap for its engine (calibrated at each heartbeat; any thread)."""
        handles = list(self.manager.pool.handles.values()) if self.manager is not None else []
        return min((h.latency_cap for h in handles), default=None)

    def wait_idle(self, timeout_s: float = 60.0) -> EngineStats:
        """Until the engine has no running or waiting work (contexts of finished calls are freed later)."""
        deadline = time.monotonic() + timeout_s
        while True:
            stats = self.stats()
            if (stats.num_running == 0 and stats.num_waiting == 0) or time.monotonic() > deadline:
                return stats
            time.sleep(0.02)


class LocalServer(ManagerServer):
    """The manager over a builtin engine of its own."""

    def __init__(self, spec: ServerSpec) -> None:
        super().__init__(spec.name, spec.manager)
        self.spec = spec
        self.engine = AsyncEngine(spec.engine)

    @property
    def model(self) -> str:
        return self.engine.model_name

    def _engine(self) -> EngineClient:
        self.engine.start()
        return self.engine

    def _stop_engine(self) -> None:
        self.engine.stop()

    def start(self, timeout_s: float = 120.0) -> LocalServer:
        super().start(timeout_s)
        return self

    def stats(self) -> EngineStats:
        return self.engine.engine.stats()


class UpstreamServer(ManagerServer):
    """The manager over an OpenAI-compatible upstream through the adapter. Its stats are the
    adapter's: tokens streamed, prompt tokens the upstream reported computing, running generations;
    its KV blocks are the adapter's token bookkeeping, not the upstream's cache (not reported)."""

    kv_reported = False
    # Sampled 20 times a second, the adapter's stats cost this process (the manager's, which
    # shares the cores with vLLM) 0.35% of a core that (d)'s plain client does not pay. Its "peak
    # running" is a 4 Hz sample: a shorter peak can be missed.
    monitor_interval_s = 0.25

    def __init__(self, spec: UpstreamSpec) -> None:
        super().__init__(spec.name, spec.manager)
        self.spec = spec
        self.client: OpenAIEngineClient = spec.upstream.client()

    @property
    def model(self) -> str:
        return self.stats().model

    def _engine(self) -> EngineClient:
        return self.client

    def start(self, timeout_s: float = 120.0) -> UpstreamServer:
        super().start(timeout_s)
        return self

    def stats(self) -> EngineStats:
        return self.client.snapshot()


class KvMonitor:
    """Samples an engine's stats every `interval_s` (default: the server's `monitor_interval_s`)
    on a thread, between `start()` and `stop()`."""

    def __init__(self, server: ManagerServer, interval_s: float | None = None) -> None:
        self.server = server
        self.interval_s = server.monitor_interval_s if interval_s is None else interval_s
        self.first: EngineStats | None = None
        self.last: EngineStats | None = None
        self.peak_blocks_used = 0
        self.peak_running = 0  # sequences the engine ran in one step, at most (sampled)
        self.latency_caps: list[int] = []  # the manager's latency cap, as sampled
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-kv-monitor", daemon=True)

    def start(self) -> KvMonitor:
        self.first = self.server.stats()
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> EngineStats:
        stats = self.server.stats()
        self.peak_blocks_used = max(self.peak_blocks_used, stats.num_blocks_total - stats.num_blocks_free)
        self.peak_running = max(self.peak_running, stats.num_running)
        cap = self.server.latency_cap()
        if cap is not None:
            self.latency_caps.append(cap)
        return stats

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.last = self._sample()

    @property
    def num_decode_tokens(self) -> int:
        assert self.first is not None and self.last is not None
        return self.last.num_decode_tokens - self.first.num_decode_tokens

    @property
    def num_prefill_tokens(self) -> int:
        assert self.first is not None and self.last is not None
        return self.last.num_prefill_tokens - self.first.num_prefill_tokens

    @property
    def peak_kv_tokens(self) -> int:
        return self.peak_blocks_used * self.server.stats().block_size


# ---- probes ---------------------------------------------------------------------------------------


def _completion(url: str, body: dict) -> httpx.Response:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    return httpx.post(f"{url}/v1/completions", json=body, headers=headers, timeout=600.0)


def accepts_ignore_eos(url: str, model: str) -> bool:
    """Does `/v1/completions` take vLLM's `ignore_eos` extension (needed for fixed-length outputs)?"""
    response = _completion(url, {"model": model, "prompt": "Hello", "max_tokens": 1, "ignore_eos": True})
    if response.status_code == 200:
        return True
    if response.status_code in (400, 422):
        return False
    response.raise_for_status()
    return False


def cached_prompt_tokens(url: str, model: str, prompt: str) -> int:
    """Send `prompt` twice through `/v1/completions`; the second answer's `cached_tokens` (0 when the
    endpoint does not reuse prefixes across requests)."""
    usage: dict[str, Any] = {}
    for _ in range(2):
        response = _completion(url, {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0})
        response.raise_for_status()
        usage = response.json().get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


async def warm_up(complete, prompt: str) -> None:  # type: ignore[no-untyped-def]
    """A few requests of the shapes the workloads use, so no configuration pays first-shape costs."""
    await complete(prompt, 8)
    await asyncio.gather(*(complete(f"{i}: {prompt[: len(prompt) // 3]}", 8) for i in range(8)))
