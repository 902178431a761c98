"""Crossing onto a session's loop (bridge.py): results, errors and items come back to the caller, whether
it blocks in a thread or awaits on another loop; blocking on the loop itself is refused, not hung."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import AsyncIterator, Iterator

import pytest

from parrot.frontend import Session
from parrot.frontend.bridge import _ON_OWN_LOOP as ON_OWN_LOOP
from parrot.frontend.bridge import is_running, iterate_blocking, iterate_on, run_blocking, run_on


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running in a thread of its own, as a sync Session's."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="owner", daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    loop.close()


async def where(value: int) -> tuple[str, int]:
    return threading.current_thread().name, value


async def fails() -> None:
    raise ValueError("refused")


async def items(num_items: int, error: bool) -> AsyncIterator[tuple[str, int]]:
    for i in range(num_items):
        yield threading.current_thread().name, i
    if error:
        raise ValueError("broke")


def test_run_blocking_runs_on_the_loop_and_returns_its_result_or_error(loop: asyncio.AbstractEventLoop) -> None:
    assert run_blocking(loop, where(7)) == ("owner", 7)
    with pytest.raises(ValueError, match="refused"):
        run_blocking(loop, fails())


def test_blocking_on_the_loop_itself_is_refused_and_the_coroutine_closed(loop: asyncio.AbstractEventLoop) -> None:
    async def inside() -> tuple[list[str], str, bool]:
        coro = where(1)
        with pytest.raises(RuntimeError) as blocked:
            run_blocking(loop, coro)
        with pytest.raises(RuntimeError) as iterated:
            next(iterate_blocking(loop, items(1, False)))
        return [str(blocked.value), str(iterated.value)], inspect.getcoroutinestate(coro), is_running(loop)

    messages, state, running = run_blocking(loop, inside())
    assert messages == [ON_OWN_LOOP] * 2
    assert state == inspect.CORO_CLOSED and running and not is_running(loop)


def test_run_on_awaits_across_loops_and_in_place(loop: asyncio.AbstractEventLoop) -> None:
    async def elsewhere() -> tuple[tuple[str, int], tuple[str, int]]:
        across = await run_on(loop, where(2))
        with pytest.raises(ValueError, match="refused"):
            await run_on(loop, fails())
        return across, await run_on(asyncio.get_running_loop(), where(3))

    across, in_place = asyncio.run(elsewhere())
    assert across == ("owner", 2)
    assert in_place == (threading.current_thread().name, 3)


def test_iterating_forwards_each_item_then_the_error(loop: asyncio.AbstractEventLoop) -> None:
    received = iterate_blocking(loop, items(3, True))
    assert [next(received) for _ in range(3)] == [("owner", 0), ("owner", 1), ("owner", 2)]
    with pytest.raises(ValueError, match="broke"):
        next(received)
    assert list(iterate_blocking(loop, items(2, False))) == [("owner", 0), ("owner", 1)]

    async def elsewhere() -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        forwarded = iterate_on(loop, items(2, True))
        across = [await anext(forwarded), await anext(forwarded)]
        with pytest.raises(ValueError, match="broke"):
            await anext(forwarded)
        here = [item async for item in iterate_on(asyncio.get_running_loop(), items(1, False))]
        return across, here

    across, here = asyncio.run(elsewhere())
    assert across == [("owner", 0), ("owner", 1)]
    assert here == [(threading.current_thread().name, 0)]


def test_a_sync_sessions_methods_on_its_own_loop_raise_instead_of_hanging() -> None:
    s = Session("http://127.0.0.1:9")  # nothing is sent: the calls are refused before any request
    try:

        async def inside() -> list[str]:
            refused = []
            for method in (s.flush, s.open, s.status, s.list_variables):
                with pytest.raises(RuntimeError) as info:
                    method()
                refused.append(str(info.value))
            return refused

        refused = asyncio.run_coroutine_threadsafe(inside(), s._loop).result(timeout=10)
        assert refused == [ON_OWN_LOOP] * 4
    finally:
        s.close()
    assert s._loop.is_closed()
    s.close()  # closing again does nothing
