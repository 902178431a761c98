"""Run a FastAPI app with uvicorn on a background thread (tests, embedded mode, benchmarks).

`ServerThread` binds 127.0.0.1 on a port the OS picks unless told otherwise, and `stop()` shuts
the server down and joins the thread.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Literal

import uvicorn
from fastapi import FastAPI


class ServerThread:
    def __init__(
        self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, lifespan: Literal["auto", "on", "off"] = "on"
    ) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        self._sock = sock
        self.host, self.port = host, sock.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", lifespan=lifespan, timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
