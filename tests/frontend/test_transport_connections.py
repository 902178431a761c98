"""The SDK's connections: the sessions of one event loop share them, and after the last session
closes they linger while they would be kept alive anyway, so a stream of one-request runs does
not connect once per run; they close when unused long enough, when `asyncio.run` ends the loop
(sessions still open then included), at `end_of_loop` (a loop stopped without cancelling its
tasks), and a loop closed without it is cleaned up by the next session that connects."""

from __future__ import annotations

import asyncio
import gc
import threading
import time

import aiohttp
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from parrot.frontend import end_of_loop
from parrot.frontend import transport as transport_module
from parrot.frontend.transport import ApiTransport
from parrot.web.server_thread import ServerThread
from tests.frontend.test_transport_retries import STATUS  # a session's status body

Connections = transport_module._Connections


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


def session(url: str) -> ApiTransport:
    api = ApiTransport(url)
    api.session_id = "s-1"
    return api


async def one_run(url: str) -> aiohttp.TCPConnector:
    """A session's life: one request, then closed (as a one-request `arun`); the connector it used."""
    api = session(url)
    try:
        assert (await api.status()).session_id == "s-1"
        connector = api._client().connector
        assert isinstance(connector, aiohttp.TCPConnector)
        return connector
    finally:
        await api.aclose()


def lingering() -> set[asyncio.Task[object]]:
    return {t for t in asyncio.all_tasks() if t.get_name() == transport_module._LINGER}


def test_runs_one_after_another_reuse_one_connection_and_asyncio_run_closes_it() -> None:
    app, ports = port_recorder()
    with ServerThread(app) as srv:

        async def main() -> tuple[asyncio.AbstractEventLoop, list[aiohttp.TCPConnector]]:
            connectors = []
            for _ in range(3):
                connectors.append(await one_run(srv.url))
                await asyncio.sleep(0.05)  # no session open in between
            assert not connectors[0].closed and len(lingering()) == 1  # kept, not closed with the last session
            return asyncio.get_running_loop(), connectors

        loop, connectors = asyncio.run(main())
        assert len(ports) == 3 and len(set(ports)) == 1  # one connection for the three runs
        assert connectors[0] is connectors[1] is connectors[2]
        assert connectors[0].closed and loop not in Connections._by_loop  # the cancelled linger closed it


def test_unused_connections_close_after_their_keepalive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport_module, "_KEEPALIVE_S", 1.0)
    app, _ = port_recorder()
    with ServerThread(app) as srv:

        async def main() -> tuple[aiohttp.TCPConnector, aiohttp.TCPConnector, float]:
            first = await one_run(srv.url)
            await asyncio.sleep(0.6)
            assert await one_run(srv.url) is first  # within the keepalive: the same connections
            released = time.monotonic()  # the wait restarts here
            await asyncio.sleep(0.6)
            assert not first.closed  # 1.2 s after the first release, 0.6 s after the second
            deadline = time.monotonic() + 10.0
            while not first.closed and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            closed_after = time.monotonic() - released
            return first, await one_run(srv.url), closed_after

        first, third, closed_after = asyncio.run(main())
        assert first.closed and 0.99 <= closed_after < 10.0
        assert third is not first  # a new connector once they closed


def test_asyncio_run_ending_with_a_session_open_leaves_nothing_behind() -> None:
    """A task still holding a session when asyncio.run ends closes it while being cancelled: no
    linger then (asyncio.run would not cancel a task started after its own list)."""
    app, _ = port_recorder()
    with ServerThread(app) as srv:
        held: list[aiohttp.TCPConnector] = []

        async def holder() -> None:
            api = session(srv.url)
            try:
                await api.status()
                held.append(api._client().connector)  # type: ignore[arg-type]
                await asyncio.sleep(3600)
            finally:
                await api.aclose()

        async def main() -> asyncio.AbstractEventLoop:
            task = asyncio.create_task(holder())
            while not held:
                await asyncio.sleep(0.01)
            assert not task.done()
            return asyncio.get_running_loop()  # the holder is still open

        loop = asyncio.run(main())
        assert held[0].closed and loop not in Connections._by_loop


def test_end_of_loop_closes_connections_released_in_the_same_task() -> None:
    """Right after a session closed, its linger task has not run yet: end_of_loop still closes it."""
    app, _ = port_recorder()
    with ServerThread(app) as srv:

        async def main() -> tuple[aiohttp.TCPConnector, set[asyncio.Task[object]]]:
            connector = await one_run(srv.url)
            await end_of_loop()
            return connector, lingering()

        connector, left = asyncio.run(main())
        assert connector.closed and left == set()


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
            assert connector.closed and loop not in Connections._by_loop
            assert not asyncio.run_coroutine_threadsafe(pending(), loop).result(timeout=30)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()
        assert len(ports) == 1


def test_a_loop_closed_while_its_connections_linger_is_cleaned_up_by_the_next_session(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app, _ = port_recorder()
    with ServerThread(app) as srv:
        loop = asyncio.new_event_loop()
        connector = loop.run_until_complete(one_run(srv.url))
        loop.close()  # no end_of_loop: the entry and its connections stay until someone looks
        assert loop in Connections._by_loop and not connector.closed
        asyncio.run(one_run(srv.url))
        assert loop not in Connections._by_loop and connector.closed
        del loop
        gc.collect()  # the closed loop's task that never ran again goes without a warning
        assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


async def pending() -> set[asyncio.Task[object]]:
    """The running loop's tasks other than the caller's."""
    return asyncio.all_tasks() - {asyncio.current_task()}  # type: ignore[operator]
