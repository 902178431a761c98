"""The SDK's transport: transient faults are retried with backoff where that is safe, and an
unreachable manager is a ParrotError(503), never a raw connection error."""

from __future__ import annotations

import asyncio
import socket

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from parrot.frontend.transport import ApiTransport
from parrot.protocol.errors import ParrotError
from parrot.protocol.objective import Criteria
from parrot.protocol.public_api import StreamChunk, SubmitRequest
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


def flaky_manager(failures: int, status: int, proxy: bool = False) -> tuple[FastAPI, dict[str, int]]:
    """Answers `failures` requests of each route with `status` (the manager's error body, or a
    proxy's plain text), then as a manager would."""
    app = FastAPI()
    seen = {"status": 0, "submit": 0, "stream": 0}

    def answer(route: str, body: object) -> Response:
        seen[route] += 1
        if seen[route] <= failures and proxy:
            return PlainTextResponse("upstream unavailable", status_code=status)
        if seen[route] <= failures:
            error = {"error": {"message": "busy", "field": None, "status": status}}
            return JSONResponse(error, status_code=status, headers={"Retry-After": "0"})
        if route == "stream":
            lines = [StreamChunk(text="a").model_dump_json(), StreamChunk(done=True).model_dump_json()]
            return PlainTextResponse("\n".join(lines) + "\n", media_type="application/x-ndjson")
        return JSONResponse(body)

    @app.get("/v1/sessions/s-1")
    async def session_status() -> Response:
        return answer("status", STATUS)

    @app.get("/v1/sessions/s-1/variables/v0/stream")
    async def stream() -> Response:
        return answer("stream", None)

    @app.post("/v1/sessions/s-1/submit")
    async def submit() -> Response:
        return answer("submit", {"variables": [], "calls": []})

    return app, seen


def transport(url: str) -> ApiTransport:
    api = ApiTransport(url, max_retries=3, backoff_s=0.01)
    api.session_id = "s-1"
    return api


def test_reads_are_retried_through_transient_answers() -> None:
    app, seen = flaky_manager(failures=2, status=503)
    with ServerThread(app) as srv:

        async def main() -> None:
            api = transport(srv.url)
            try:
                assert (await api.status()).session_id == "s-1"
                assert [seen["status"], api.num_retries] == [3, 2]
                assert [chunk async for chunk in api.stream_variable("v0", Criteria.LATENCY)] == ["a"]
                assert [seen["stream"], api.num_retries] == [3, 4]
            finally:
                await api.aclose()

        asyncio.run(main())


def test_a_read_gives_up_after_its_retries() -> None:
    app, seen = flaky_manager(failures=10, status=502)
    with ServerThread(app) as srv:

        async def main() -> None:
            api = transport(srv.url)
            try:
                with pytest.raises(ParrotError) as info:
                    await api.status()
                assert [info.value.status, seen["status"], api.num_retries] == [502, 4, 3]
            finally:
                await api.aclose()

        asyncio.run(main())


def test_an_unreachable_manager_is_a_parrot_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nobody listens here once the socket closes

    async def main() -> None:
        api = transport(f"http://127.0.0.1:{port}")
        try:
            with pytest.raises(ParrotError) as info:
                await api.status()
            assert info.value.status == 503
            assert info.value.message.startswith("cannot reach the manager")
            assert api.num_retries == 3
        finally:
            await api.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("status", [429, 503])
def test_a_submit_the_manager_refused_is_sent_again(status: int) -> None:
    """The manager's own 429 / 503 body says the batch was not applied (all or nothing)."""
    app, seen = flaky_manager(failures=2, status=status)
    with ServerThread(app) as srv:

        async def main() -> None:
            api = transport(srv.url)
            try:
                assert (await api.submit(SubmitRequest())).calls == []
                assert [seen["submit"], api.num_retries] == [3, 2]
            finally:
                await api.aclose()

        asyncio.run(main())


@pytest.mark.parametrize(("status", "proxy"), [(503, True), (502, False), (504, False)])
def test_a_submit_that_may_have_arrived_is_never_sent_twice(status: int, proxy: bool) -> None:
    """A proxy's 503, or a 502/504, may come after the manager applied the batch."""
    app, seen = flaky_manager(failures=1, status=status, proxy=proxy)
    with ServerThread(app) as srv:

        async def main() -> None:
            api = transport(srv.url)
            try:
                with pytest.raises(ParrotError) as info:
                    await api.submit(SubmitRequest())
                assert [info.value.status, seen["submit"], api.num_retries] == [status, 1, 0]
            finally:
                await api.aclose()

        asyncio.run(main())


def test_the_environments_proxy_is_read_once_while_a_loops_sessions_are_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTP_PROXY / NO_PROXY are honored as `trust_env` would, but read once per event loop, when
    its sessions connect, not at every request (nor at every one-request run)."""
    for name in ("HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", "manager.local")

    async def proxies() -> list[str | None]:
        transports = [ApiTransport(u) for u in ("http://manager.internal:8000", "http://manager.local:8000")]
        try:
            for t in transports:
                t._client()
            monkeypatch.setenv("HTTP_PROXY", "http://other.example:3128")  # read already: not seen
            later = ApiTransport("http://manager.internal:8000")
            later._client()
            transports.append(later)
            return [t._proxy for t in transports]
        finally:
            for t in transports:
                await t.aclose()

    assert asyncio.run(proxies()) == ["http://proxy.example:3128", None, "http://proxy.example:3128"]
    # Once every session of the loop closed, the next one reads the environment again.
    assert asyncio.run(proxies()) == ["http://other.example:3128", None, "http://other.example:3128"]
