"""The synchronous client of LLMEngine: blocking helpers for scripts, benchmarks and tests (no event loop).

`submit` queues an extend and returns a handle; `wait` collects its events (`wait_filled`: the one
event of an extend without sampling). Several handles submitted before waiting run batched
together in the engine.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass, field

from parrot.engine.llm_engine import LLMEngine
from parrot.engine.sched.job import JobEvent
from parrot.protocol.engine_api import ExtendRequest, Filled, TokenEvent
from parrot.protocol.errors import ParrotError


@dataclass
class Handle:
    events: queue.Queue[JobEvent] = field(default_factory=queue.Queue)

    def sink(self, event: JobEvent) -> None:
        self.events.put(event)


def submit(engine: LLMEngine, req: ExtendRequest) -> Handle:
    h = Handle()
    engine.submit_extend(req, h.sink)
    return h


def wait(h: Handle, timeout: float = 300.0) -> list[TokenEvent]:
    """Every event of the extend, the last with its finish_reason; an error raises ParrotError."""
    out: list[TokenEvent] = []
    while True:
        event = h.events.get(timeout=timeout)
        if isinstance(event, ParrotError):
            raise event
        out.append(event)
        if event.finish_reason is not None:
            return out


def wait_filled(h: Handle, timeout: float = 300.0) -> Filled:
    """What an extend without sampling did (its one event)."""
    (event,) = wait(h, timeout)
    assert event.filled is not None
    return event.filled


def extend(engine: LLMEngine, req: ExtendRequest) -> list[TokenEvent]:
    return wait(submit(engine, req))


def extend_only(engine: LLMEngine, req: ExtendRequest) -> Filled:
    """An extend without sampling, waited for: what its tokens did."""
    return wait_filled(submit(engine, req))


def token_ids(events: list[TokenEvent]) -> list[int]:
    """The generated ids of a finished generation (EOS included if it ended there)."""
    return [e.token_id for e in events if e.token_id is not None]
