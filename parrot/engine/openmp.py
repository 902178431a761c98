"""How the engine's OpenMP workers wait between parallel ops (torch's CPU build runs them on libgomp).

A decode step is ~150 parallel ops with a few microseconds of Python between them. Between two
ops libgomp's worker spins before it sleeps on a futex, and waking a sleeping worker costs far
more than the gap (on a virtual machine, a wake-up of an idle virtual CPU). libgomp spins 300,000
iterations (a few ms) normally, but only 100 (about a microsecond) once the process has more
OpenMP threads than CPUs, and every thread that ever ran a parallel op keeps its own team of
workers while it lives: on two cores, the thread that loaded the model plus the engine's loop
thread are already too many, so without the remedies below the worker sleeps between nearly every
op of every step.

Three remedies, measured on the serving path:
1. `prefer_spinning()` (run when `parrot.engine` is imported, before torch loads libgomp): with
   neither `OMP_WAIT_POLICY` nor `GOMP_SPINCOUNT` set, it sets `OMP_WAIT_POLICY=ACTIVE` with
   `GOMP_SPINCOUNT=300000`. The spin count is libgomp's usual one, so an idle engine still stops
   spinning after a few ms; what changes is the oversubscribed spin, 1,000 iterations instead of
   100 (libgomp's own figure under ACTIVE; it never exceeds the spin count). A process where torch
   is already loaded, or where either variable is set, is left as it is.
2. `passing_thread`: `LLMEngine.__init__` (loading the model, allocating the KV cache) runs on a
   thread that ends afterwards, so its team of workers goes with it and a serving process keeps
   one team, the loop thread's (the thread count it set is carried back to the caller's thread).
3. `LLMEngine`'s loop thread ends after `IDLE_EXIT_S` without work while another engine is
   started in the process (the next request starts another thread), so an idle engine keeps no
   team beside a busy one: with two engines in one process, the idle one's team makes the busy one's
   decode steps ~2x slower (6 rows over a 1,056-token prefix: 33 ms against 17, what
   OMP_WAIT_POLICY=PASSIVE gives with one engine; 97,700 context switches against 37,000). An engine
   alone in its process keeps its thread: a new thread's first step takes ~6 ms longer (23 ms
   against 17 for a 32-token prompt), which a request after each pause would pay.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import weakref
from collections.abc import Callable, Mapping, MutableMapping
from typing import ParamSpec, TypeVar

T = TypeVar("T")
P = ParamSpec("P")

SPIN_COUNT = "300000"  # libgomp's default when OMP_WAIT_POLICY is unset
WAIT_POLICY = {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": SPIN_COUNT}  # what prefer_spinning sets


def prefer_spinning(
    environ: MutableMapping[str, str] = os.environ, modules: Mapping[str, object] = sys.modules
) -> bool:
    """Set libgomp's wait policy for the engine if nobody chose one and torch is not loaded yet.
    True when it set it."""
    if "torch" in modules or "OMP_WAIT_POLICY" in environ or "GOMP_SPINCOUNT" in environ:
        return False
    environ.update(WAIT_POLICY)
    return True


def on_passing_thread(fn: Callable[[], T], name: str = "parrot-engine-setup") -> T:
    """`fn()` on a new thread that ends when it returns (its OpenMP workers end with it); its result,
    or its exception raised here. torch's intra-op thread count as `fn` left it holds on the caller's
    thread too (libgomp keeps that count per thread: a caller that ran torch ops before would keep
    its own). A daemon thread: a Ctrl-C on the caller does not wait for a model load to finish."""
    out: list[T] = []
    err: list[BaseException] = []
    threads: list[int] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # re-raised on the caller's thread
            err.append(e)
        finally:
            if "torch" in sys.modules:
                threads.append(sys.modules["torch"].get_num_threads())

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    thread.join()
    if threads and threads[0] != sys.modules["torch"].get_num_threads():
        sys.modules["torch"].set_num_threads(threads[0])  # sets the count; starts no workers
    if err:
        raise err[0]
    return out[0]


def passing_thread(fn: Callable[P, T]) -> Callable[P, T]:
    """`fn`, run by `on_passing_thread` at each call."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        return on_passing_thread(lambda: fn(*args, **kwargs))

    return run


_started: weakref.WeakSet[object] = weakref.WeakSet()  # engines whose loop runs (or may), this process
_started_lock = threading.Lock()


def engine_started(engine: object, started: bool) -> None:
    """Count `engine` among the process's started engines, or not (LLMEngine.start / stop)."""
    with _started_lock:
        if started:
            _started.add(engine)
        else:
            _started.discard(engine)


def others_started(engine: object) -> bool:
    """True when another engine is started in this process (its team would share the cores)."""
    with _started_lock:
        return any(e is not engine for e in _started)
