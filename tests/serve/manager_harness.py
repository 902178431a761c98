"""Running a manager in a test: one event loop for the test body, a session to work in."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from parrot.protocol.engine_client import EngineClient
from parrot.serve.clock import REAL_CLOCK, LoopClock
from parrot.serve.config import ManagerConfig
from parrot.serve.manager import Manager, create_manager
from parrot.serve.runtime.session import Session
from parrot.sim.loop import run_virtual


def run_manager(
    engines: Sequence[EngineClient],
    body: Callable[[Manager], Awaitable[None]],
    config: ManagerConfig | None = None,
    *,
    stepped: bool = False,
    virtual: bool = False,
) -> None:
    """Run `body(manager)` on a fresh loop, then stop the manager. `stepped`: the engines are
    registered but the executor's loop never starts, so only the test moves it (`step()`).
    `virtual`: the loop's time is virtual (parrot.sim.loop) and the manager reads it: sleeps take
    no wall time and every time is exact (`now()`)."""

    async def main() -> None:
        manager = create_manager(list(engines), config=config, clock=LoopClock() if virtual else REAL_CLOCK)
        await (manager.pool.start() if stepped else manager.start())
        try:
            await body(manager)
        finally:
            await manager.stop()

    if virtual:
        run_virtual(main())
    else:
        asyncio.run(main())


def now() -> float:
    """The running loop's time (virtual under `run_manager(..., virtual=True)`)."""
    return asyncio.get_running_loop().time()


def new_session(manager: Manager, api_key: str = "key") -> Session:
    created = manager.create_session(api_key)
    return manager.session(created.session_id, created.token)
