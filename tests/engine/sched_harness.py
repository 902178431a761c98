"""A scheduler on its own (no model): jobs added by hand, steps planned and applied as the engine
would, for the scheduler's unit tests."""

from __future__ import annotations

import itertools

from parrot.engine.config import EngineConfig
from parrot.engine.kv.block_pool import BlockPool
from parrot.engine.kv.context import Context, ContextTable
from parrot.engine.sched.job import Job, JobKind
from parrot.engine.sched.scheduler import Scheduler
from parrot.protocol.objective import Objective


class Harness:
    def __init__(self, **config: object) -> None:
        cfg = EngineConfig(max_num_batched_tokens=2048, **config)  # type: ignore[arg-type]
        self.contexts = ContextTable(BlockPool(4096), 16)
        self.scheduler = Scheduler(cfg, self.contexts, 8192)
        self.ids = itertools.count()

    def job(
        self,
        kind: JobKind,
        cid: str,
        objective: Objective = Objective.LATENCY,
        tokens: int = 0,
        fork_from: str | None = None,
        priority: int = 0,
    ) -> Job:
        if cid not in self.contexts:
            self.contexts.contexts[cid] = Context(cid, fork_from)
        job = Job(next(self.ids), kind, cid, lambda e: None, objective, priority, 0.0, fork_from=fork_from)
        job.token_ids = list(range(tokens))
        self.scheduler.add(job)
        return job

    def fill(self, cid: str, objective: Objective, tokens: int) -> Job:
        return self.job(JobKind.FILL, cid, objective, tokens)

    def generate(self, cid: str, objective: Objective, fork_from: str | None = None) -> Job:
        return self.job(JobKind.GENERATE, cid, objective, fork_from=fork_from)

    def plan_tokens(self) -> list[int]:
        return [s.num_new for s in self.scheduler.schedule().seqs]

    def step(self) -> dict[str, int]:
        """Plan a step and apply it as the engine would (tokens computed; fills with nothing left end)."""
        plan = self.scheduler.schedule()
        out: dict[str, int] = {}
        for s in plan.seqs:
            ctx = self.contexts.get(s.job.context_id)
            ctx.num_computed += s.num_new
            out[s.job.context_id] = out.get(s.job.context_id, 0) + s.num_new
            if s.job.kind is JobKind.FILL and ctx.num_computed >= s.job.target:
                self.scheduler.finish(s.job)
        return out

    def computed(self, cid: str, num_tokens: int) -> None:
        """A context holding `num_tokens` tokens, all computed but the last (as after a fill)."""
        ctx = self.contexts.create(cid)
        ctx.tokens = list(range(num_tokens))
        self.contexts.reserve(ctx, num_tokens)
        ctx.num_computed = num_tokens - 1
