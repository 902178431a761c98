"""A Semantic Variable on the manager: a future, produced once and read by many.

Owned by its session's graph; mutated only on the manager's event loop. A variable is set exactly
once (by the client for an input, by its producer call for an output) or fails with an error; after
that it never changes. While its producer generates, text arrives in chunks that streaming readers
see as they come.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from parrot.protocol.errors import ParrotError, conflict
from parrot.protocol.objective import Criteria
from parrot.protocol.public_api import VariableInfo, VariableState


class Variable:
    __slots__ = (
        "_changed",
        "chunks",
        "consumer_call_ids",
        "criteria",
        "error",
        "logprobs_read",
        "name",
        "producer_call_id",
        "scores",
        "value",
        "var_id",
        "watched",
    )

    def __init__(self, var_id: str, name: str | None = None) -> None:
        self.var_id = var_id
        self.name = name
        self.producer_call_id: str | None = None
        self.consumer_call_ids: list[str] = []
        self.value: str | None = None
        self.error: ParrotError | None = None
        self.chunks: list[str] = []  # streamed text so far; joined, it is the value once set
        self.scores: dict[str, float] | None = None  # a scored select's log-probability per choice
        # The strongest criteria a `get` asked for; objective deduction (deduction.py) reads it.
        self.criteria: Criteria | None = None
        # Someone reads (or said they will read) the text as it is generated: a stream reader, an
        # OpenAI request with `stream`. A generation dispatched unwatched may deliver tokens in batches.
        self.watched = False
        # Someone reads the generated tokens' logprobs (an OpenAI request with `logprobs`); the SDK
        # reads only text, so an engine need not compute them (ExtendRequest.logprobs).
        self.logprobs_read = False
        self._changed = asyncio.Event()

    @property
    def is_done(self) -> bool:
        return self.value is not None or self.error is not None

    @property
    def state(self) -> VariableState:
        if self.error is not None:
            return VariableState.ERROR
        return VariableState.PENDING if self.value is None else VariableState.READY

    def info(self) -> VariableInfo:
        return VariableInfo(
            var_id=self.var_id,
            name=self.name,
            state=self.state,
            producer_call_id=self.producer_call_id,
            num_consumers=len(self.consumer_call_ids),
        )

    def append(self, text: str) -> None:
        """A producer's streamed text; the value is set later by `set`."""
        if text:
            self.chunks.append(text)
            self._wake()

    def set(self, value: str) -> None:
        if self.is_done:
            raise conflict(f"variable {self.var_id!r} is already set", field="value")
        # A producer streamed exactly its value; a client-set input arrives as one chunk.
        if not self.chunks:
            self.chunks.append(value)
        self.value = value
        self._wake()

    def fail(self, error: ParrotError) -> None:
        if not self.is_done:
            self.error = error
            self._wake()

    def _wake(self) -> None:
        # Waiters hold the old event; a fresh one serves the next change.
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait(self, timeout_s: float) -> None:
        """Until set or failed; raise ParrotError(408) after `timeout_s` seconds."""
        try:
            async with asyncio.timeout(timeout_s):
                while not self.is_done:
                    await self._changed.wait()
        except TimeoutError:
            raise ParrotError(
                f"variable {self.var_id!r} is not ready after timeout_s={timeout_s:g}", status=408, field="timeout_s"
            ) from None

    async def stream(self, joined: bool = False) -> AsyncGenerator[str, None]:
        """Text chunks as they arrive; ends when set, raises the variable's error if it fails.

        `joined`: the chunks that arrived since the last yield come as one (a reader that pairs
        the text with the producer's state at that moment, e.g. its tokens so far)."""
        self.watched = True
        num_sent_chunks = 0
        while True:
            changed = self._changed
            if self.error is not None:
                raise self.error
            if num_sent_chunks < len(self.chunks):
                new = self.chunks[num_sent_chunks:]
                num_sent_chunks = len(self.chunks)
                for text in ["".join(new)] if joined else new:
                    yield text
                continue
            if self.value is not None:
                return
            await changed.wait()
