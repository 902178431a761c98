"""A real uvicorn server on 127.0.0.1 with an OS-picked port, in a background thread, for tests."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


@contextmanager
def serve_in_thread(make_app: Callable[[], Awaitable[Any]]) -> Iterator[tuple[str, asyncio.AbstractEventLoop]]:
    """Build the app on the server's loop (`await make_app()`), serve it, yield (base_url, loop)."""
    loop = asyncio.new_event_loop()
    state: dict[str, Any] = {}

    def run() -> None:
        asyncio.set_event_loop(loop)

        async def main() -> None:
            app = await make_app()
            config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
            server = uvicorn.Server(config)
            state["server"] = server
            await server.serve()

        try:
            loop.run_until_complete(main())
        except BaseException as e:  # reported to the test thread
            state["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not (state.get("server") and state["server"].started):
        if "error" in state or not thread.is_alive():
            raise RuntimeError(f"server did not start: {state.get('error')!r}")
        if time.monotonic() > deadline:
            raise TimeoutError("server did not start in 60 s")
        time.sleep(0.01)
    server = state["server"]
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", loop
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        loop.close()
