"""Several tiny-model engines, each served over HTTP on loopback, for multi-engine manager tests.

`farm(folder, n)` starts n engines (each its own AsyncEngine and uvicorn ServerThread on
127.0.0.1:0); stopping one's ServerThread mid-run is how a test kills an engine. `reference`
generates directly on an engine (fill, generate, free: two Extends and a Free): the oracle for a call's output.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from parrot.engine.async_engine import AsyncEngine
from parrot.engine.config import EngineConfig
from parrot.engine.server.app import create_engine_app
from parrot.protocol.engine_api import ExtendRequest, FreeContextRequest
from parrot.protocol.engine_client import extend_only
from parrot.protocol.sampling import SamplingParams
from parrot.web.server_thread import ServerThread


@dataclass
class ServedEngine:
    engine: AsyncEngine
    server: ServerThread

    @property
    def url(self) -> str:
        return self.server.url


def start_engine(folder: Path, num_blocks: int = 1024) -> AsyncEngine:
    config = EngineConfig(model=str(folder), dtype="float32", num_blocks=num_blocks, block_size=16, num_threads=1)
    engine = AsyncEngine(config)
    engine.start()
    return engine


@contextmanager
def farm(folder: Path, num_engines: int) -> Iterator[list[ServedEngine]]:
    served: list[ServedEngine] = []
    try:
        for _ in range(num_engines):
            engine = start_engine(folder)
            served.append(ServedEngine(engine, ServerThread(create_engine_app(engine)).start()))
        yield served
    finally:
        for s in served:
            s.server.stop()
            # A killed engine's jobs may still report to its stopped server's closed loop.
            with contextlib.suppress(RuntimeError):
                s.engine.stop()


async def reference(engine: AsyncEngine, token_ids: list[int], sampling: SamplingParams) -> str:
    context_id = f"ref-{uuid.uuid4().hex}"
    await extend_only(engine, ExtendRequest(context_id=context_id, token_ids=token_ids))
    generation = ExtendRequest(context_id=context_id, append=True, sampling=sampling)
    text = "".join([e.text async for e in engine.extend(generation)])
    await engine.free(FreeContextRequest(context_id=context_id))
    return text
