"""Context frees in flight: a retired call's engine context is freed in a task of its own.

Owned by the executor. A free outlives the call's record (the executor may forget the call while
its one request is in flight; the engine frees a context with queued work when that work ends), so
the tasks are kept here until they end; `drain` waits for them (shutdown, tests, an engine's
removal).
"""

from __future__ import annotations

import asyncio

from parrot.serve.runtime.call_run import CallRun


class ContextFrees:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def retire(self, run: CallRun) -> None:
        """Drop the call's runner and free its context in a task of its own, which cancelling the
        call does not interrupt."""
        runner, run.runner = run.runner, None
        if runner is None:
            return
        if runner.counts_as_early_filled:
            runner.counts_as_early_filled = False
            runner.engine.num_early_filled_calls -= 1
        task = asyncio.get_running_loop().create_task(runner.free())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Until every free in flight is done."""
        await asyncio.gather(*self._tasks, return_exceptions=True)
