"""The simulated engine's step scheduler: jobs, the plan of one step, and applying it.

Mirrors the builtin engine's rules (parrot/engine/sched/scheduler.py) at the level the cost model
sees: a token budget per step (`latency_max_batched_tokens` while latency-critical work decodes,
else `max_num_batched_tokens`); decode rows first, then chunked prefill; jobs ranked by objective
(latency first), priority, arrival. When blocks run out it reclaims idle contexts (least recently
used), then preempts the lowest-ranked decoding job (its KV is dropped and recomputed later).
A job waits for earlier jobs on its context. Owns the job list; `engine.py` owns the loop.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from parrot.protocol.engine_api import TokenEvent
from parrot.protocol.objective import Objective
from parrot.sim.cost import DecodeGroup, PrefillChunk, StepShape
from parrot.sim.kv import BlockTable, OutOfBlocks, SimContext

# What a simulated generation samples: one token whose text repeats stably (" the" in the
# SmolLM2/LLaMA-style tokenizers), so an output of n tokens re-tokenizes to n tokens downstream.
GEN_TOKEN_ID = 260
GEN_TOKEN_TEXT = " the"


@dataclass
class SimJob:
    job_id: int
    ctx: SimContext
    objective: Objective
    priority: int
    target: int  # a fill: compute until num_computed reaches it
    max_tokens: int = 0  # 0: a fill
    num_generated: int = 0
    num_computed_tokens: int = 0  # prefill tokens this job computed
    aborted: bool = False
    done: asyncio.Future[int] | None = None  # a fill's: resolved with its computed tokens
    events: asyncio.Queue[TokenEvent] | None = None  # a generation's stream

    @property
    def decoding(self) -> bool:
        return self.max_tokens > 0 and self.num_generated > 0

    def prefill_target(self) -> int:
        """Computed tokens before the job can sample: the whole prompt for a new generation; all
        but the last sampled token for one resuming after preemption; the fill's target."""
        if self.max_tokens == 0:
            return self.target
        return self.ctx.num_tokens - (1 if self.num_generated else 0)

    def rank(self) -> tuple[bool, int, int]:
        return (self.objective is not Objective.LATENCY, -self.priority, self.job_id)


@dataclass
class StepPlan:
    rows: list[SimJob] = field(default_factory=list)  # decode: one token each
    chunks: list[tuple[SimJob, int, int]] = field(default_factory=list)  # (job, tokens, cached before)

    def shape(self) -> StepShape:
        groups: dict[str, list[SimContext]] = {}
        for job in self.rows:
            groups.setdefault(job.ctx.root_id, []).append(job.ctx)
        decodes = tuple(
            DecodeGroup(tuple(c.num_tokens for c in ctxs), min(c.shared_len for c in ctxs) if len(ctxs) > 1 else 0)
            for ctxs in groups.values()
        )
        prefills = tuple(
            PrefillChunk(n, cached, samples=job.max_tokens > 0 and cached + n == job.ctx.num_tokens)
            for job, n, cached in self.chunks
        )
        return StepShape(prefills, decodes)


@dataclass
class SchedulerConfig:
    max_num_batched_tokens: int
    latency_max_batched_tokens: int


class SimScheduler:
    def __init__(self, kv: BlockTable, config: SchedulerConfig) -> None:
        self.kv = kv
        self.config = config
        self.jobs: list[SimJob] = []  # arrival order
        self.num_preemptions = 0

    def eligible(self) -> list[SimJob]:
        """Jobs not waiting behind an earlier job on the same context."""
        seen: set[str] = set()
        out = []
        for job in self.jobs:
            if job.ctx.context_id not in seen:
                out.append(job)
                seen.add(job.ctx.context_id)
        return out

    def _fit(self, job: SimJob, num: int, decoding: list[SimJob]) -> int:
        """Tokens of `num` that get blocks, reclaiming idle contexts, then (for a decode row)
        preempting lower-ranked decoding jobs."""
        kv = self.kv
        need = kv.blocks_for(job.ctx, num)
        if need > kv.num_free:
            kv.reclaim_idle(need, keep={j.ctx.context_id for j in self.jobs})
        while kv.blocks_for(job.ctx, num) > kv.num_free and num == 1 and job.decoding:
            victims = [j for j in decoding if j is not job and j.ctx.blocks and j.rank() > job.rank()]
            if not victims:
                return 0
            self.preempt(max(victims, key=SimJob.rank))
        if kv.blocks_for(job.ctx, num) <= kv.num_free:
            return num
        room = kv.num_free * kv.block_size + (-job.ctx.num_computed) % kv.block_size
        return max(0, min(num, room))

    def preempt(self, job: SimJob) -> None:
        """Drop the job's KV: it recomputes its context (prompt and output so far) when next run."""
        self.kv.release(job.ctx)
        self.num_preemptions += 1

    def plan(self) -> StepPlan:
        plan = StepPlan()
        jobs = [j for j in self.eligible() if not j.aborted]
        decoding = sorted(
            (j for j in jobs if j.decoding and j.ctx.num_computed == j.ctx.num_tokens - 1), key=SimJob.rank
        )
        latency = any(j.objective is Objective.LATENCY for j in decoding)
        budget = self.config.latency_max_batched_tokens if latency else self.config.max_num_batched_tokens
        for job in decoding:
            if budget == 0:
                break
            if job.ctx.num_computed != job.ctx.num_tokens - 1:  # preempted by a higher-ranked row
                continue
            if self._fit(job, 1, decoding) == 1:
                self.kv.compute(job.ctx, 1)
                plan.rows.append(job)
                budget -= 1
        prefilling = sorted(
            (j for j in jobs if j not in plan.rows and j.ctx.num_computed < j.prefill_target()), key=SimJob.rank
        )
        for job in prefilling:
            if budget == 0:
                break
            num = self._fit(job, min(job.prefill_target() - job.ctx.num_computed, budget), decoding)
            if num <= 0:
                continue
            cached = job.ctx.num_computed
            self.kv.compute(job.ctx, num)
            plan.chunks.append((job, num, cached))
            budget -= num
        if not plan.rows and not plan.chunks:
            self._unstick(jobs)
        return plan

    def _unstick(self, jobs: list[SimJob]) -> None:
        """Nothing fit: preempt the lowest-ranked job holding blocks, so the best one can run."""
        holders = [j for j in jobs if j.ctx.blocks]
        if len(holders) > 1 or (holders and holders[0] is not min(jobs, key=SimJob.rank)):
            self.preempt(max(holders, key=SimJob.rank))
            return
        if not jobs:
            return
        raise OutOfBlocks(min(jobs, key=SimJob.rank).ctx.context_id)

    def apply(self, plan: StepPlan, now: float) -> tuple[list[SimJob], int]:
        """After the step's time passed: sampled tokens join their contexts. Returns the jobs that
        sampled a token this step and the number of prefill tokens computed."""
        sampled = list(plan.rows)
        num_prefill = 0
        for job, num, cached in plan.chunks:
            num_prefill += num
            job.num_computed_tokens += num
            if job.max_tokens > 0 and job.num_generated == 0 and cached + num == job.ctx.num_tokens:
                sampled.append(job)  # the prompt's last chunk samples the first token
        for job in sampled:
            job.ctx.num_tokens += 1
            job.num_generated += 1
        return sampled, num_prefill

    def finish(self, job: SimJob, now: float) -> None:
        if job in self.jobs:
            self.jobs.remove(job)
        if all(j.ctx is not job.ctx for j in self.jobs):
            job.ctx.busy = False
        job.ctx.last_used = now
