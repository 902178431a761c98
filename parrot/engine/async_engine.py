"""AsyncEngine: LLMEngine behind the in-process asyncio engine API (for the manager, the HTTP server).

    engine = AsyncEngine(EngineConfig(model="smollm2-135m"))   # loads the model (blocking)
    engine.start()                                              # starts the compute loop thread
    async for event in engine.extend(ExtendRequest(...)): ...
    engine.stop()

Methods raise ParrotError for bad requests before anything changes. `extend` yields TokenEvents
(one `filled` event for an extend without sampling); the last one has `finish_reason`; an error
before the first event raises ParrotError, one after it ends the stream with finish_reason
"error". Closing a generation's iterator early (or cancelling its task) aborts the generation;
the tokens produced so far stay in the context. A fill, once queued, runs to its end.

Events cross from the engine's loop thread to the callers' event loops once per step: the engine
hands a step's events over in one call (`LLMEngine.hand_off`) and `_hand_off` schedules one
callback per event loop that puts each event in its request's queue, so a step of 32 rows wakes
the loop once, not 32 times.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from parrot.engine.config import EngineConfig
from parrot.engine.leases import LeaseKeeper
from parrot.engine.llm_engine import LLMEngine
from parrot.engine.sched.job import JobEvent, StepEvents, deliver
from parrot.protocol.engine_api import (
    EngineStats,
    ExtendRequest,
    FreeContextRequest,
    LeaseRequest,
    TokenEvent,
)
from parrot.protocol.errors import ParrotError


class Channel:
    """One request's events, read on the event loop that submitted it."""

    __slots__ = ("loop", "queue")

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[JobEvent] = asyncio.Queue()

    def __call__(self, event: JobEvent) -> None:
        """A lone event (an error, an abort): outside any step's hand-off."""
        _wake(self.loop, [(self.queue, event)])


def hand_off(events: StepEvents) -> None:
    """One step's events: one callback per caller event loop; other sinks are called here."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[JobEvent], JobEvent]]] = {}
    for sink, event in events:
        if isinstance(sink, Channel):
            by_loop.setdefault(sink.loop, []).append((sink.queue, event))
        else:  # an engine-internal sink, or a blocking client's, sharing the engine
            deliver([(sink, event)])
    for loop, items in by_loop.items():
        _wake(loop, items)


def _wake(loop: asyncio.AbstractEventLoop, items: list[tuple[asyncio.Queue[JobEvent], JobEvent]]) -> None:
    # A closed caller loop raises RuntimeError: nobody is listening any more.
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(put_all, items)


def put_all(items: list[tuple[asyncio.Queue[Any], Any]]) -> None:
    """On the caller's loop: each event into its request's queue, in the step's order."""
    for queue, event in items:
        queue.put_nowait(event)


class AsyncEngine:
    def __init__(self, config: EngineConfig | None = None, engine: LLMEngine | None = None) -> None:
        self.engine = engine or LLMEngine(config or EngineConfig())
        self.engine.hand_off = hand_off
        self.leases = LeaseKeeper(self.engine.context_ids, self.engine.free)

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

    async def extend(self, req: ExtendRequest) -> AsyncIterator[TokenEvent]:
        if req.sampling is not None and req.sampling.constrained:
            # Compiled off the event loop (up to seconds); the submission finds it cached.
            await asyncio.to_thread(self.engine.grammars.check, req.sampling)
        channel = Channel()
        job_id = self.engine.submit_extend(req, channel)
        started = finished = False
        try:
            while True:
                event = await channel.queue.get()
                if isinstance(event, ParrotError):
                    finished = True
                    if not started:
                        raise event  # nothing was produced: the caller sees the error with its status
                    yield TokenEvent(token_id=None, finish_reason="error", error=event.message)
                    return
                started = True
                finished = event.finish_reason is not None
                yield event
                if finished:
                    return
        finally:
            if not finished and req.sampling is not None:
                self.engine.abort(job_id)  # the reader went away (closed, cancelled): stop spending compute on it

    async def free(self, req: FreeContextRequest) -> None:
        self.engine.free(req)

    async def stats(self) -> EngineStats:
        return self.engine.stats()

    async def renew_lease(self, req: LeaseRequest) -> None:
        """In process (the embedded mode) the contexts die with the manager: nothing to hold. The
        engine's HTTP server keeps the leases of the managers that reach it (`self.leases`)."""
