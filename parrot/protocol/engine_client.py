"""The engine contract as the manager sees it: the client protocol every engine backend implements.

`EngineClient` is structural: the builtin engine's in-process `AsyncEngine` satisfies it as is (the
embedded mode); `parrot.backends` holds the others (the engine API over HTTP, the OpenAI-compatible
adapter). Errors arrive as ParrotError with the engine's status and field; an engine that does not
answer raises EngineUnavailable. The launcher hands clients to the manager; the manager never
builds one itself (engine registration goes through an `EngineConnector` the launcher gives it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol, runtime_checkable

from parrot.protocol.engine_api import (
    EngineStats,
    ExtendRequest,
    Filled,
    FreeContextRequest,
    LeaseRequest,
    TokenEvent,
)
from parrot.protocol.errors import ParrotError
from parrot.protocol.public_api import RegisterEngineRequest


class EngineUnavailable(ParrotError):
    """The engine did not answer (connection refused or dropped, timeout): the engine may be dead,
    not the request wrong. The executor re-dispatches the call elsewhere."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=503, field=None)


@runtime_checkable
class EngineClient(Protocol):
    def extend(self, req: ExtendRequest) -> AsyncIterator[TokenEvent]:
        """Append the request's tokens to a context (creating or forking it), then, with sampling,
        decode into it (engine_api.ExtendRequest). Runs after earlier work on the context. The
        stream: one `filled` event without sampling, else the generation's events (the first
        carries `filled` when tokens went in); the last has finish_reason. Errors found before
        anything ran raise ParrotError; a generation that fails later ends with finish_reason
        "error". Closing the iterator early aborts a generation (its tokens so far stay in the
        context); tokens already queued to go in still do."""
        ...

    async def free(self, req: FreeContextRequest) -> None:
        """Release a context; one with work pending is released when that work ends and takes
        no new work meanwhile (404, as if gone). 404 for an unknown id."""
        ...

    async def stats(self) -> EngineStats: ...

    async def renew_lease(self, req: LeaseRequest) -> None:
        """Hold the contexts the request's prefixes name for its ttl (engine_api.LeaseRequest); an
        engine whose contexts die with the manager (in process, an adapter's) does nothing."""
        ...


class EngineConnector(Protocol):
    """Builds the client for an engine an operator registers while serving (`POST /v1/engines`).

    The launcher gives the manager's app one (parrot.backends.connect.connect_engine); the manager
    never imports a backend. `has_tokenizer`: the manager has a tokenizer folder of its own to fall
    back on. Raises ParrotError naming the request field at fault; the caller closes the client
    (`aclose`, where it has one) if it then fails to add the engine."""

    async def __call__(self, req: RegisterEngineRequest, *, has_tokenizer: bool) -> EngineClient: ...


async def engine_model_folder(client: EngineClient) -> Path | None:
    """Where the engine's tokenizer lives, if the client can say: its `model_folder` (in-process
    engine, a configured adapter), else the `model_folder` of its `info()` (HTTP engine, adapter)."""
    folder = getattr(client, "model_folder", None)
    info = getattr(client, "info", None)
    if folder is None and info is not None:
        folder = (await info()).get("model_folder")
    return None if folder is None else Path(folder)


async def extend_only(client: EngineClient, req: ExtendRequest) -> Filled:
    """An extend without sampling: its one event's `filled`. Raises what the engine raises, and
    ParrotError for an error event; EngineUnavailable when the stream ends without its result."""
    if req.sampling is not None:
        raise ValueError("extend_only takes an extend without sampling")
    events = client.extend(req)
    try:
        async for event in events:
            if event.finish_reason == "error":
                raise ParrotError(f"engine error: {event.error}", status=500)
            if event.filled is not None:
                return event.filled
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
    raise EngineUnavailable(f"the engine's answer to extending {req.context_id!r} ended without its result")
