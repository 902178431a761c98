"""What the scheduling policy sees: each waiting call's view (scheduler.CallView), kept by the
executor, and the snapshot built from them and the engines.

A view is recomputed when its call is marked dirty (an input set or failed, a new deduced
objective, an early fill). Its prefix points are computed then too, and noted in the prefix index
(so prefixes that several known calls share are cached before either runs); its prefix hits are
refreshed at every snapshot, since other calls create and evict cached prefixes all the time.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable

from parrot.serve.config import ManagerConfig
from parrot.serve.policy.plan import CallKey, CallView, EngineView, Snapshot
from parrot.serve.policy.prefix import PrefixPoint
from parrot.serve.runtime.analysis import failed_input, inputs_ready, num_ready_pieces
from parrot.serve.runtime.call_runner import CallRunner
from parrot.serve.runtime.contexts import prompt_points
from parrot.serve.runtime.engines import EnginePool
from parrot.serve.runtime.graph import CallNode
from parrot.serve.runtime.prefix_cache import PrefixCache
from parrot.serve.runtime.session import Session


class CallViews:
    def __init__(self, pool: EnginePool, config: ManagerConfig, cache: PrefixCache | None) -> None:
        self.pool = pool
        self.config = config
        self.cache = cache
        self._views: dict[CallKey, CallView] = {}
        self._points: dict[CallKey, tuple[PrefixPoint, ...]] = {}  # of the ready prefix
        self._ready_since: dict[CallKey, float] = {}

    def update(self, key: CallKey, session: Session, call: CallNode, runner: CallRunner | None) -> None:
        variables = session.graph.variables
        failed = failed_input(call, variables)
        ready = inputs_ready(call, variables)
        num_ready = num_ready_pieces(call, variables)
        now = time.monotonic()
        if ready:
            self._ready_since.setdefault(key, now)
        points: tuple[PrefixPoint, ...] = ()
        if self.cache is not None and failed is None and num_ready > 0:
            tokenizer = self.pool.for_model(call.model).tokenizer
            _, points = prompt_points(call, variables, tokenizer, num_ready, self.config.prefix_block_tokens)
            self.cache.note_call(key, points)
        self._points[key] = points
        self._views[key] = CallView(
            key=key,
            model=call.model,
            order=call.order,
            inputs_ready=ready,
            failed_var_id=None if failed is None else failed.var_id,
            num_ready_pieces=num_ready,
            num_filled_pieces=call.num_fill_requested,
            engine_id=call.engine_id,
            objective=call.objective,
            priority=call.priority,
            task_group=None if call.task_group is None else f"{key[0]}/{call.task_group}",
            pinned=runner is not None and runner.has_context,
            ready_since=self._ready_since.get(key, now),
        )

    def drop(self, key: CallKey) -> None:
        self._views.pop(key, None)
        self._points.pop(key, None)
        self._ready_since.pop(key, None)

    def snapshot(self, running: Iterable[tuple[CallKey, str, CallNode]]) -> Snapshot:
        """The policy's input: every waiting call's view, every engine's, and where the running
        calls (key, engine_id, call) of each task group and application are."""
        engines = tuple(
            EngineView(
                h.engine_id,
                h.model,
                h.num_running_calls,
                h.max_running_calls or self.config.max_running_calls_per_engine,
                h.num_early_filled_calls,
                self.config.max_early_filled_calls_per_engine,
                alive=h.alive and not h.suspected,
                num_latency_calls=h.num_latency_calls,
                latency_cap=h.latency_cap,
            )
            for h in self.pool.handles.values()
        )
        groups: dict[str, set[str]] = {}
        apps: dict[str, set[str]] = {}
        for key, engine_id, call in running:
            if call.task_group is not None:
                groups.setdefault(f"{key[0]}/{call.task_group}", set()).add(engine_id)
            apps.setdefault(key[0], set()).add(engine_id)
        return Snapshot(
            self.current(),
            engines,
            self.config.early_fill,
            now=time.monotonic(),
            aging_s=self.config.aging_s,
            group_engines={g: tuple(sorted(es)) for g, es in groups.items()},
            app_engines={a: tuple(sorted(es)) for a, es in apps.items()},
        )

    def current(self) -> tuple[CallView, ...]:
        """Every view, with its prefix hits as the index has them now."""
        if self.cache is not None:
            for key, points in self._points.items():
                if points:
                    hits = tuple(sorted(self.cache.hits(points).items()))
                    view = self._views[key]
                    if hits != view.prefix_hits:
                        self._views[key] = dataclasses.replace(view, prefix_hits=hits)
        return tuple(self._views.values())
