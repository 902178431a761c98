"""What the scheduling policy sees: each waiting call's view (policy.plan.CallView), kept on its run
record (call_run.py), and the snapshot built from the records and the engines.

A view is recomputed when its call is marked dirty (`mark`: an input set or failed, a new deduced
objective, an early fill); a step refreshes the marked calls only. Its prefix points are computed
then too, and noted in the prefix index (so prefixes that several known calls share are cached
before either runs); its prefix hits are refreshed at a snapshot when the index's engines for one
of its points changed since the last snapshot (other calls create and evict cached prefixes all the
time; the rest keep theirs, so a step with 10k waiting calls does not look each of them up again).

A snapshot lists only the waiting calls a policy can act on (`CallView.actionable`: an input failed, every
input set, or ready pieces not yet filled early), kept in an index as views are computed: a call
that waits on its producers with nothing to fill early is in no plan, and 10k of them (the second
calls of 10k chains) would otherwise cost every step a walk over all of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping

from parrot.serve.config import ManagerConfig
from parrot.serve.policy.plan import CallKey, CallView, EngineView, Snapshot
from parrot.serve.policy.prefix import PrefixPoint
from parrot.serve.runtime.analysis import failed_input, inputs_ready, num_ready_pieces
from parrot.serve.runtime.call_run import CallRun, CallState
from parrot.serve.runtime.contexts import prompt_points
from parrot.serve.runtime.engines import EnginePool
from parrot.serve.runtime.placements import Placements
from parrot.serve.runtime.prefix_cache import PrefixCache
from parrot.serve.runtime.variable import Variable


class CallViews:
    def __init__(self, pool: EnginePool, config: ManagerConfig, cache: PrefixCache | None) -> None:
        self.pool = pool
        self.config = config
        self.cache = cache
        self.placed = Placements()  # where the running calls are; the executor adds and removes them
        self._num_engines: dict[str, int] = {}  # model -> engines serving it, at the last snapshot
        self._listed: dict[CallKey, CallRun] = {}  # runs whose view was actionable when computed
        self._dirty: set[CallKey] = set()  # marked since the last refresh (a run's flag: whether still)

    def mark(self, key: CallKey, run: CallRun) -> None:
        """The waiting call's view is computed again at the next step."""
        run.dirty = True
        self._dirty.add(key)

    def refresh(self, runs: Mapping[CallKey, CallRun], variables: Callable[[str], Mapping[str, Variable]]) -> None:
        """Compute again the views of the waiting calls marked since the last refresh, each once,
        in submission order (a step looks at those, not at every call); `variables`: a session's."""
        marked = [(run.order, key, run) for key in self._dirty if (run := runs.get(key)) is not None and run.dirty]
        self._dirty.clear()
        for _, key, run in sorted(marked, key=lambda entry: entry[0]):
            run.dirty = False
            if run.state is CallState.WAITING:
                self.update(key, variables(key[0]), run)

    def update(self, key: CallKey, variables: Mapping[str, Variable], run: CallRun) -> None:
        """Compute the waiting call's view (and prefix points) into its record."""
        call = run.call
        failed = failed_input(call, variables)
        ready = inputs_ready(call, variables)
        num_ready = num_ready_pieces(call, variables)
        now = self.pool.clock.now()
        if ready and run.ready_since is None:
            run.ready_since = now
        points: tuple[PrefixPoint, ...] = ()
        if self.cache is not None and failed is None and num_ready > 0:
            tokenizer = self.pool.for_model(call.model).tokenizer
            _, points = prompt_points(call, variables, tokenizer, num_ready, self.config.sharing.prefix_block_tokens)
            self.cache.note_call(key, points)
        run.prefix_points = points
        run.prefix_hashes = frozenset(p.prefix_hash for p in points)
        run.hits_stale = True
        run.view = CallView(
            key=key,
            model=call.model,
            order=run.order,
            inputs_ready=ready,
            failed_var_id=None if failed is None else failed.var_id,
            num_ready_pieces=num_ready,
            num_filled_pieces=run.num_fill_requested,
            engine_id=run.engine_id,
            objective=run.objective,
            priority=run.priority,
            task_group=None if run.task_group is None else f"{key[0]}/{run.task_group}",
            pinned=run.runner is not None and run.runner.has_context,
            ready_since=now if run.ready_since is None else run.ready_since,
            tenant=run.tenant,
        )
        if run.view.actionable:
            self._listed[key] = run
        else:
            self._listed.pop(key, None)

    def listed(self) -> list[CallRun]:
        """The waiting runs a policy can act on, in submission order (runs that left waiting since
        are dropped from the index here)."""
        for key in [k for k, run in self._listed.items() if run.view is None]:
            del self._listed[key]
        return sorted(self._listed.values(), key=lambda run: run.order)

    def snapshot(self) -> Snapshot:
        """The policy's input: the actionable waiting calls' views, every engine's, and where the running
        calls of each task group and application are (from `placed`, which the executor keeps as
        runs take and give back engine slots: a step does not walk the running calls)."""
        placed = self.placed
        engines = tuple(
            EngineView(
                h.engine_id,
                h.model,
                h.num_running_calls,
                h.max_running_calls or self.config.scheduling.max_running_calls_per_engine,
                h.num_early_filled_calls,
                self.config.scheduling.max_early_filled_calls_per_engine,
                alive=h.alive and not h.suspected,
                num_latency_calls=h.num_latency_calls,
                latency_cap=h.latency_cap,
            )
            for h in self.pool.handles.values()
        )
        return Snapshot(
            self.current(self.listed()),
            engines,
            self.config.scheduling.early_fill,
            now=self.pool.clock.now(),
            aging_s=self.config.scheduling.aging_s,
            group_engines=placed.group_engines,
            app_engines=placed.app_engines,
            tenant_running=placed.tenant_running,
        )

    def current(self, runs: Iterable[CallRun]) -> tuple[CallView, ...]:
        """Every waiting call's view, with its prefix hits as the index has them now (refreshed
        where a point's engines changed since the last snapshot: every waiting call is passed)."""
        cache = self.cache
        changed = cache.take_changed() if cache is not None else set()
        num_engines: dict[str, int] = {}
        for h in self.pool.handles.values():
            num_engines[h.model] = num_engines.get(h.model, 0) + 1
        every = num_engines != self._num_engines  # the floor's meaning changed: every call again
        self._num_engines = num_engines
        views = []
        for run in runs:
            view = run.view
            if view is None:
                continue
            if (
                cache is not None
                and run.prefix_points
                and (every or run.hits_stale or not changed.isdisjoint(run.prefix_hashes))
            ):
                run.hits_stale = False
                over, floor = cache.hits_over_floor(run.prefix_points, num_engines.get(view.model, 0))
                hits = tuple(sorted(over.items()))
                if hits != view.prefix_hits or floor != view.prefix_floor:
                    view = run.view = dataclasses.replace(view, prefix_hits=hits, prefix_floor=floor)
            views.append(view)
        return tuple(views)
