"""Run a FastAPI app with uvicorn on a background thread (embedded mode, tests, benchmarks).

`ServerThread` binds 127.0.0.1 on a port the OS picks unless told otherwise, runs the server on an
event loop of its own (`loop`: where the app's state lives, for callers that must run coroutines
there), and `stop()` shuts the server down and joins the thread. The one such helper in the tree.

The loop is uvloop's where it is installed (it is a dependency; absent on Windows): the manager's
thread spends ~11% less CPU a request on it (README, "What the manager's path cost a request"),
CPU an engine sharing the machine gets back.
"""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import uvicorn
from fastapi import FastAPI

try:
    from uvloop import new_event_loop
except ImportError:  # pragma: no cover - not built for this platform
    from asyncio import new_event_loop  # type: ignore[assignment]


class ServerThread:
    def __init__(
        self,
        app: FastAPI,
        host: str = "127.0.0.1",
        port: int = 0,
        lifespan: Literal["auto", "on", "off"] = "on",
        graceful_shutdown_s: int = 2,
        name: str = "parrot-server",
    ) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        self._sock = sock
        self.host, self.port = host, sock.getsockname()[1]
        config = uvicorn.Config(
            app, log_level="warning", lifespan=lifespan, timeout_graceful_shutdown=graceful_shutdown_s
        )
        self.server = uvicorn.Server(config)
        self.loop = new_event_loop()
        # Its worker threads (asyncio.to_thread: tokenizing a batch, ...) named after it, so what
        # the server costs can be told from the rest of the process (benchmarks.common.machine.thread_cpu_s).
        self.loop.set_default_executor(ThreadPoolExecutor(thread_name_prefix=f"{name}-pool"))
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        self.loop.run_until_complete(self.server.serve(sockets=[self._sock]))

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                self.stop()
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout=timeout)
        self._sock.close()
        if not self._thread.is_alive() and not self.loop.is_closed():
            self.loop.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
