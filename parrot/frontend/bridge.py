"""Crossing onto a session's event loop: the one place the SDK's sync forms meet its async ones.

A session's requests run on one loop (a sync `Session`'s own, in a background thread; an
`AsyncSession`'s, the caller's). Everything the SDK does is written once, as coroutines and async
iterators on that loop; the sync forms run them there and wait (`run_blocking`,
`iterate_blocking`), and async code on another loop awaits them across (`run_on`, `iterate_on`).
Blocking on the loop itself would hang it: refused with a RuntimeError.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from typing import Any, TypeVar

T = TypeVar("T")
_END = object()  # after the last item of a forwarded iterator
_ON_OWN_LOOP = "a blocking call on the session's own event loop would hang it: use the async form (`aget`, ...)"


def is_running(loop: asyncio.AbstractEventLoop) -> bool:
    """The caller runs on `loop` (a coroutine or callback of it)."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def run_blocking(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """`coro` run on `loop` (another thread's) while this thread waits: its result, or its error."""
    if is_running(loop):
        coro.close()
        raise RuntimeError(_ON_OWN_LOOP)
    return _submit(loop, coro).result()


async def run_on(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """`coro` awaited on `loop`: here if it is the running loop, else run there and awaited here."""
    if is_running(loop):
        return await coro
    return await asyncio.wrap_future(_submit(loop, coro))


def iterate_blocking(loop: asyncio.AbstractEventLoop, items: AsyncIterator[T]) -> Iterator[T]:
    """`items` iterated on `loop` (another thread's), each handed to this thread as it comes."""
    if is_running(loop):
        raise RuntimeError(_ON_OWN_LOOP)
    received: queue.SimpleQueue[object] = queue.SimpleQueue()
    _forward(loop, items, received.put)
    while (item := received.get()) is not _END:
        yield _item(item)


async def iterate_on(loop: asyncio.AbstractEventLoop, items: AsyncIterator[T]) -> AsyncIterator[T]:
    """`items` iterated on `loop`: here if it is the running loop, else there, each item forwarded."""
    if is_running(loop):
        async for each in items:
            yield each
        return
    here = asyncio.get_running_loop()
    received: asyncio.Queue[object] = asyncio.Queue()
    _forward(loop, items, lambda item: here.call_soon_threadsafe(received.put_nowait, item))
    while (item := await received.get()) is not _END:
        yield _item(item)


def _forward(loop: asyncio.AbstractEventLoop, items: AsyncIterator[Any], put: Callable[[object], Any]) -> None:
    """Iterate `items` on `loop`, handing `put` each item, then its error if it fails, then `_END`."""

    async def pump() -> None:
        try:
            async for item in items:
                put(item)
        except BaseException as e:  # delivered to the reader, which re-raises it
            put(e)
        put(_END)

    _submit(loop, pump())


def _submit(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
    """`coro` scheduled on `loop` from any thread (closed, never started, if `loop` is closed)."""
    try:
        return asyncio.run_coroutine_threadsafe(coro, loop)
    except BaseException:
        coro.close()
        raise


def _item(item: object) -> Any:
    if isinstance(item, BaseException):
        raise item
    return item
