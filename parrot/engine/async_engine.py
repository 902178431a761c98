"""AsyncEngine: LLMEngine behind the in-process asyncio engine API (for the manager, the HTTP server).

    engine = AsyncEngine(EngineConfig(model="smollm2-135m"))   # loads the model (blocking)
    engine.start()                                              # starts the compute loop thread
    result = await engine.fill(FillRequest(...))
    async for event in engine.generate(GenerateRequest(...)): ...
    engine.stop()

Methods raise ParrotError for bad requests before anything changes. `generate` yields TokenEvents;
the last one has `finish_reason`; an error before the first token raises ParrotError, one after it
ends the stream with finish_reason "error". Closing the iterator early (or cancelling its task)
aborts the generation; the tokens produced so far stay in the context.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from parrot.engine.config import EngineConfig
from parrot.engine.leases import LeaseKeeper
from parrot.engine.llm_engine import LLMEngine
from parrot.engine.sched.job import JobEvent
from parrot.protocol.engine_api import (
    EngineStats,
    FillRequest,
    FillResult,
    FreeContextRequest,
    GenerateRequest,
    LeaseRequest,
    TokenEvent,
)
from parrot.protocol.errors import ParrotError


class AsyncEngine:
    def __init__(self, config: EngineConfig | None = None, engine: LLMEngine | None = None) -> None:
        self.engine = engine or LLMEngine(config or EngineConfig())
        self.leases = LeaseKeeper(self.engine.context_ids, self.engine.free_context)

    @property
    def model_name(self) -> str:
        return self.engine.model_name

    @property
    def model_folder(self) -> Path:
        return self.engine.model_folder

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def start(self) -> None:
        self.engine.start()

    def stop(self) -> None:
        self.engine.stop()

    def _channel(self) -> tuple[asyncio.Queue[JobEvent], object]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[JobEvent] = asyncio.Queue()

        def sink(event: JobEvent) -> None:
            # A closed caller loop raises RuntimeError: nobody is listening any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(queue.put_nowait, event)

        return queue, sink

    async def fill(self, req: FillRequest) -> FillResult:
        queue, sink = self._channel()
        self.engine.submit_fill(req, sink)  # type: ignore[arg-type]
        event = await queue.get()
        if isinstance(event, ParrotError):
            raise event
        assert isinstance(event, FillResult)
        return event

    async def generate(self, req: GenerateRequest) -> AsyncIterator[TokenEvent]:
        if req.sampling.constrained:  # compiled off the event loop (up to seconds); submit finds it cached
            await asyncio.to_thread(self.engine.grammars.check, req.sampling)
        queue, sink = self._channel()
        job_id = self.engine.submit_generate(req, sink)  # type: ignore[arg-type]
        started = finished = False
        try:
            while True:
                event = await queue.get()
                if isinstance(event, ParrotError):
                    finished = True
                    if not started:
                        raise event  # nothing was produced: the caller sees the error with its status
                    yield TokenEvent(token_id=None, finish_reason="error", error=event.message)
                    return
                started = True
                assert isinstance(event, TokenEvent)
                finished = event.finish_reason is not None
                yield event
                if finished:
                    return
        finally:
            if not finished:  # the reader went away (closed, cancelled): stop spending compute on it
                self.engine.abort(job_id)

    async def free_context(self, req: FreeContextRequest) -> None:
        self.engine.free_context(req)

    async def stats(self) -> EngineStats:
        return self.engine.stats()

    async def renew_lease(self, req: LeaseRequest) -> None:
        """In process (the embedded mode) the contexts die with the manager: nothing to hold. The
        engine's HTTP server keeps the leases of the managers that reach it (`self.leases`)."""
