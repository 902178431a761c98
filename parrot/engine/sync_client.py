"""The synchronous client of LLMEngine: blocking helpers for scripts, benchmarks and tests (no event loop).

`submit_*` queue work and return a handle; `wait` collects its events. Several handles submitted
before waiting run batched together in the engine.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass, field

from parrot.engine.llm_engine import LLMEngine
from parrot.engine.sched.job import JobEvent
from parrot.protocol.engine_api import FillRequest, FillResult, GenerateRequest, TokenEvent
from parrot.protocol.errors import ParrotError


@dataclass
class Handle:
    events: queue.Queue[JobEvent] = field(default_factory=queue.Queue)

    def sink(self, event: JobEvent) -> None:
        self.events.put(event)


def submit_fill(engine: LLMEngine, req: FillRequest) -> Handle:
    h = Handle()
    engine.submit_fill(req, h.sink)
    return h


def submit_generate(engine: LLMEngine, req: GenerateRequest) -> Handle:
    h = Handle()
    engine.submit_generate(req, h.sink)
    return h


def wait_fill(h: Handle, timeout: float = 300.0) -> FillResult:
    event = h.events.get(timeout=timeout)
    if isinstance(event, ParrotError):
        raise event
    assert isinstance(event, FillResult)
    return event


def wait_generate(h: Handle, timeout: float = 300.0) -> list[TokenEvent]:
    out: list[TokenEvent] = []
    while True:
        event = h.events.get(timeout=timeout)
        if isinstance(event, ParrotError):
            raise event
        assert isinstance(event, TokenEvent)
        out.append(event)
        if event.finish_reason is not None:
            return out


def fill(engine: LLMEngine, req: FillRequest) -> FillResult:
    return wait_fill(submit_fill(engine, req))


def generate(engine: LLMEngine, req: GenerateRequest) -> list[TokenEvent]:
    return wait_generate(submit_generate(engine, req))


def token_ids(events: list[TokenEvent]) -> list[int]:
    """The generated ids of a finished generation (EOS included if it ended there)."""
    return [e.token_id for e in events if e.token_id is not None]
