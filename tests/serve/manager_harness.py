"""Running a manager in a test: one event loop for the test body, a session to work in."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from parrot.protocol.engine_client import EngineClient
from parrot.serve.config import ManagerConfig
from parrot.serve.manager import Manager, create_manager
from parrot.serve.runtime.session import Session


def run_manager(
    engines: Sequence[EngineClient],
    body: Callable[[Manager], Awaitable[None]],
    config: ManagerConfig | None = None,
    *,
    stepped: bool = False,
) -> None:
    """Run `body(manager)` on a fresh loop, then stop the manager. `stepped`: the engines are
    registered but the executor's loop never starts, so only the test moves it (`step()`)."""

    async def main() -> None:
        manager = create_manager(list(engines), config=config)
        await (manager.pool.start() if stepped else manager.start())
        try:
            await body(manager)
        finally:
            await manager.stop()

    asyncio.run(main())


def new_session(manager: Manager, api_key: str = "key") -> Session:
    created = manager.create_session(api_key)
    return manager.session(created.session_id, created.token)
