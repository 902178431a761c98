"""The SDK's connections: the sessions of one event loop share them, and after the last session
closes they linger while they would be kept alive anyway, so a stream of one-request runs does
not connect once per run; they close when unused long enough, when `asyncio.run` ends the loop,
and when a sync Session stops its own."""

from __future__ import annotations

import asyncio
import threading

import aiohttp
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from parrot.frontend import transport as transport_module
from parrot.frontend.transport import ApiTransport, end_of_loop
from parrot.web.server_thread import ServerThread

STATUS = {
    "session_id": "s-1",
    "num_variables": 0,
    "num_calls": 0,
    "num_calls_waiting": 0,
    "num_calls_running": 0,
    "num_calls_done": 0,
    "num_calls_failed": 0,
    "idle_timeout_s": 60.0,
    "idle_s": 0.0,
}


def port_recorder() -> tuple[FastAPI, list[int]]:
    """A manager's status route that records the client port of every request (one per connection)."""
    app = FastAPI()
    ports: list[int] = []

    @app.get("/v1/sessions/s-1")
    async def status(request: Request) -> JSONResponse:
        assert request.client is not None
        ports.append(request.client.port)
        return JSONResponse(STATUS)

    return app, ports


async def one_run(url: str) -> aiohttp.TCPConnector:
    """A session's life: one request, then closed (as a one-request `arun`); the connector it used."""
    api = ApiTransport(url)
    api.session_id = "s-1"
    try:
        assert (await api.status()).session_id == "s-1"
        connector = api._client().connector
        assert isinstance(connector, aiohttp.TCPConnector)
        return connector
    finally:
        await api.aclose()


def test_runs_one_after_another_reuse_one_connection_and_asyncio_run_closes_it() -> None:
    app, ports = port_recorder()
    with ServerThread(app) as srv:

        async def main() -> list[aiohttp.TCPConnector]:
            connectors = []
            for _ in range(3):
                connectors.append(await one_run(srv.url))
                await asyncio.sleep(0.05)  # no session open in between
            assert not connectors[0].closed  # lingering, not closed with the last session
            return connectors

        connectors = asyncio.run(main())
        assert len(ports) == 3 and len(set(ports)) == 1  # one connection for the three runs
        assert connectors[0] is connectors[1] is connectors[2]
        assert connectors[0].closed  # asyncio.run cancelled the linger: closed, nothing left pending


def test_unused_connections_close_after_their_keepalive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport_module, "_KEEPALIVE_S", 0.1)
    app, ports = port_recorder()
    with ServerThread(app) as srv:

        async def main() -> tuple[aiohttp.TCPConnector, aiohttp.TCPConnector]:
            first = await one_run(srv.url)
            await asyncio.sleep(0.06)
            second = await one_run(srv.url)  # within the keepalive: the same connection, the wait restarts
            assert second is first
            await asyncio.sleep(0.06)
            assert not first.closed
            await asyncio.sleep(0.2)
            assert first.closed  # unused for longer than the keepalive
            return first, await one_run(srv.url)

        first, third = asyncio.run(main())
        assert third is not first
        assert len(ports) == 3 and ports[0] == ports[1] != ports[2]


def test_a_loop_stopped_without_cancelling_its_tasks_closes_its_connections_first() -> None:
    """A sync Session's own loop: `end_of_loop` closes the lingering connections and leaves no
    task pending (a pending one would be destroyed with the loop, its connector left open)."""
    app, ports = port_recorder()
    with ServerThread(app) as srv:
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, daemon=True)
        thread.start()
        try:
            connector = asyncio.run_coroutine_threadsafe(one_run(srv.url), loop).result(timeout=30)
            assert not connector.closed
            asyncio.run_coroutine_threadsafe(end_of_loop(), loop).result(timeout=30)
            assert connector.closed
            assert not asyncio.run_coroutine_threadsafe(pending(), loop).result(timeout=30)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()
        assert len(ports) == 1


async def pending() -> set[asyncio.Task[object]]:
    """The running loop's tasks other than the caller's."""
    return asyncio.all_tasks() - {asyncio.current_task()}  # type: ignore[operator]
