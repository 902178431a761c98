"""Real-engine fixtures for integration tests: a tiny-model AsyncEngine, a recording wrapper, and
the manager's app served by uvicorn on 127.0.0.1 (OS-picked port) in a background thread.

Imported by tests/serve/conftest.py and tests/frontend/conftest.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi import FastAPI

from parrot.backends.connect import connect_engine
from parrot.engine.async_engine import AsyncEngine
from parrot.engine.config import EngineConfig
from parrot.protocol.engine_api import (
    EngineStats,
    ExtendRequest,
    FreeContextRequest,
    LeaseRequest,
    TokenEvent,
)
from parrot.protocol.engine_client import extend_only
from parrot.protocol.sampling import SamplingParams
from parrot.serve import ManagerConfig, create_app, create_manager
from parrot.serve.config import SchedulingConfig
from parrot.serve.manager import Manager
from parrot.web.server_thread import ServerThread


class RecordingEngine:
    """Delegates to an engine and logs (time, op, context_id, num_tokens) of every request: an
    Extend without sampling as "fill" (its tokens), one with sampling as "generate" (0);
    "generated" is logged when a generation's last event arrives."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.model_folder = engine.model_folder
        self.log: list[tuple[float, str, str, int]] = []

    async def extend(self, req: ExtendRequest) -> AsyncIterator[TokenEvent]:
        generating = req.sampling is not None
        self.log.append(
            (
                time.monotonic(),
                "generate" if generating else "fill",
                req.context_id,
                0 if generating else len(req.token_ids),
            )
        )
        num_tokens = 0
        async with contextlib.aclosing(self.engine.extend(req)) as events:  # closed early: the engine aborts
            async for event in events:
                num_tokens += event.token_id is not None
                if generating and event.finish_reason is not None:
                    self.log.append((time.monotonic(), "generated", req.context_id, num_tokens))
                yield event

    async def free(self, req: FreeContextRequest) -> None:
        await self.engine.free(req)
        self.log.append((time.monotonic(), "free", req.context_id, 0))

    async def stats(self) -> EngineStats:
        return await self.engine.stats()

    async def renew_lease(self, req: LeaseRequest) -> None:
        await self.engine.renew_lease(req)

    def first(self, op: str, context_suffix: str) -> float:
        return next(t for t, o, c, _ in self.log if o == op and c.endswith(context_suffix))


def start_tiny_engine(model_folder: Path, num_blocks: int = 4096) -> AsyncEngine:
    engine = AsyncEngine(EngineConfig(model=str(model_folder), dtype="float32", num_blocks=num_blocks, block_size=16))
    engine.start()
    return engine


@contextmanager
def serve_app(app: FastAPI) -> Iterator[tuple[str, asyncio.AbstractEventLoop]]:
    """Serve `app` (lifespan on) on 127.0.0.1:0 in a thread; yield (base_url, the server's loop)."""
    server = ServerThread(app, graceful_shutdown_s=5, name="test-manager").start(timeout=60)
    try:
        yield server.url, server.loop
    finally:
        server.stop()


@dataclass
class LiveServer:
    url: str
    manager: Manager
    engine: RecordingEngine
    loop: asyncio.AbstractEventLoop

    def call(self, coro):  # type: ignore[no-untyped-def]
        """Run a coroutine on the server's loop (the manager's state lives there)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=120)

    def stats(self) -> EngineStats:
        return self.call(self.engine.stats())

    def clear_prefix_cache(self) -> None:
        """Free the manager's idle cached prefix contexts: they outlive sessions by design."""
        prefixes = self.manager.prefixes
        if prefixes is not None:
            self.call(prefixes.clear(self.manager.pool.handles))

    def wait_blocks_free(self, num_blocks_free: int, timeout_s: float = 30.0) -> EngineStats:
        """Poll until the engine's free block count is `num_blocks_free` (frees run after calls end),
        once the idle cached prefixes are freed too."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.clear_prefix_cache()
            stats = self.stats()
            if stats.num_blocks_free == num_blocks_free or time.monotonic() > deadline:
                return stats
            time.sleep(0.02)

    def direct_generate(self, token_ids: list[int], sampling: SamplingParams) -> str:
        """The oracle: fill `token_ids` into a fresh context, generate, free; the text."""

        async def go() -> str:
            context_id = f"oracle-{uuid.uuid4().hex}"
            await extend_only(self.engine.engine, ExtendRequest(context_id=context_id, token_ids=token_ids))
            generation = ExtendRequest(context_id=context_id, append=True, sampling=sampling)
            text = "".join([e.text async for e in self.engine.engine.extend(generation)])
            await self.engine.engine.free(FreeContextRequest(context_id=context_id))
            return text

        return self.call(go())


@contextmanager
def live_server(engine: AsyncEngine, config: ManagerConfig | None = None) -> Iterator[LiveServer]:
    recorder = RecordingEngine(engine)
    manager = create_manager([recorder], config=config)
    with serve_app(create_app(manager, connect_engine=connect_engine)) as (url, loop):
        yield LiveServer(url, manager, recorder, loop)


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_folder: Path) -> Iterator[AsyncEngine]:
    engine = start_tiny_engine(tiny_model_folder)
    yield engine
    engine.stop()


@pytest.fixture
def server(tiny_engine: AsyncEngine) -> Iterator[LiveServer]:
    with live_server(tiny_engine, ManagerConfig(scheduling=SchedulingConfig(max_running_calls_per_engine=128))) as srv:
        yield srv
