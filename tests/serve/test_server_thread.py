"""The embedded HTTP server's connections send at once (TCP_NODELAY): with Nagle's algorithm on, a
response written as headers then body waited for the client's delayed ACK, ~40 ms on every request
of a kept-alive connection (asyncio sets TCP_NODELAY only on sockets whose protocol is TCP, and the
listening socket was created with protocol 0)."""

from __future__ import annotations

import socket

import httpx
from fastapi import FastAPI

from parrot.web.server_thread import ServerThread


def test_every_connection_has_nagle_off() -> None:
    app = FastAPI()

    @app.get("/ping")
    async def ping() -> dict[str, str]:
        return {"ok": "yes"}

    with ServerThread(app, lifespan="off") as server, httpx.Client(base_url=server.url) as client:
        assert [client.get("/ping").status_code for _ in range(3)] == [200, 200, 200]
        connections = list(server.server.server_state.connections)
        assert len(connections) == 1  # kept alive: the three requests went on one connection
        sock = connections[0].transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
