"""The simulated engine's step scheduler: its jobs, the builtin engine's step planning over them,
and applying a step.

Each step is planned by `parrot.engine.sched.plan.plan_step`, the builtin engine's own rules (token
budget, latency cap, contention window, decodes first, chunked prefill, tiers and the outranked
share, a prompt's last chunk running over a decode-free step, reclaim of idle and waiting contexts,
preemption of the lowest-ranked running job), with the builtin engine's ordering policy
(`policy.make_priority`: latency-critical or aged first, then priority, then arrival) on the
virtual clock. The setup gives the numbers (`step_rules`): the CPU setups the builtin engine's
defaults; the GPU setups leave out its finer rules (no prefill-sized steps, outranked share,
running-over, aging or step limit).

This class is the planner's `Owner`: the jobs (a job waits for earlier jobs on its context and on the
parent it forks), their progress, and the KV primitives over `BlockTable` (kv.py). The simulator's
own rules: in `reserve`, vLLM's admission, where a prompt starts only when the blocks of its whole
prefill are free, beside what started prompts still need and a 1% watermark (the builtin engine
reserves a chunk at a time); reclaim and preemption release a context's whole block table (the
builtin engine keeps the leading blocks another context shares). Not modelled: interrupting a
running step between layers when a better tier arrives. Owns the job lists; `engine.py` owns the
loop.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field

from parrot.engine.sched.plan import CONTENTION_S, StepRules, plan_step
from parrot.engine.sched.policy import OrderKey, make_priority
from parrot.protocol.engine_api import TokenEvent
from parrot.protocol.objective import Objective
from parrot.sim.cost import DecodeGroup, PrefillChunk, StepShape
from parrot.sim.kv import BlockTable, OutOfBlocks, SimContext
from parrot.sim.profiles import Setup

# What a simulated generation samples: one token whose text repeats stably (" the" in the
# SmolLM2/LLaMA-style tokenizers), so an output of n tokens re-tokenizes to n tokens downstream.
GEN_TOKEN_ID = 260
GEN_TOKEN_TEXT = " the"


@dataclass(eq=False)  # a job is itself: membership tests compare identity, not every field
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
    fork_from: SimContext | None = None  # a fork waiting for its parent's earlier jobs
    done: asyncio.Future[int] | None = None  # a fill's: resolved with its computed tokens
    events: asyncio.Queue[TokenEvent] | None = None  # a generation's stream
    arrival: float = 0.0  # virtual time it was added (SimScheduler.add)
    reports_fill: bool = False  # a generation whose extend had tokens: its first event says what they did

    @property
    def context_id(self) -> str:
        return self.ctx.context_id

    @property
    def decoding(self) -> bool:
        return self.max_tokens > 0 and self.num_generated > 0

    @property
    def end(self) -> int:
        """Computed tokens at which the job samples (a generation: its whole context) or ends (a
        fill: its target)."""
        return self.ctx.num_tokens if self.max_tokens > 0 else self.target


@dataclass
class StepPlan:
    rows: list[SimJob] = field(default_factory=list)  # decode: one token each
    chunks: list[tuple[SimJob, int, int]] = field(default_factory=list)  # (job, tokens, cached before)
    failed: list[SimJob] = field(default_factory=list)  # jobs whose KV fits nowhere (ended by the engine)

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
            if n
        )
        return StepShape(prefills, decodes)


def step_rules(setup: Setup, latency_max_batched_tokens: int) -> StepRules:
    """The planner's numbers for a setup. A setup without `latency_prefill_tokens` gives prefill-only
    steps of latency work the whole budget."""
    full = setup.max_num_batched_tokens
    return StepRules(
        max_num_batched_tokens=full,
        latency_max_batched_tokens=latency_max_batched_tokens,
        latency_prefill_tokens=full if setup.latency_prefill_tokens is None else setup.latency_prefill_tokens,
        outranked_chunk_tokens=setup.outranked_chunk_tokens,
        max_num_seqs=setup.max_num_seqs,
        remainder_share=setup.remainder_share,
    )


def order_key(setup: Setup) -> OrderKey:
    """The builtin engine's priority policy; a setup without `aging_s` never ages a job."""
    return make_priority(math.inf if setup.aging_s is None else setup.aging_s)


class SimScheduler:
    def __init__(self, kv: BlockTable, rules: StepRules, key: OrderKey) -> None:
        self.kv = kv
        self.rules = rules
        self.order_key = key
        self.jobs: list[SimJob] = []  # arrival order
        self.running: list[SimJob] = []  # admitted: their prompt got its blocks (reserve)
        self.waiting: list[SimJob] = []  # not admitted yet, or preempted
        self.num_preemptions = 0
        self.num_reused_tokens = 0  # KV tokens forks took over from their parents
        self.watermark = max(1, kv.num_blocks // 100)  # free blocks admission leaves for decode growth
        self._contended_until = 0.0  # steps stay prefill-sized until then (plan.token_budget)
        self._ready: set[SimJob] = set()  # while planning: the eligible jobs
        self._failed: list[SimJob] = []  # while planning: the rejected jobs
        self._now = 0.0

    def add(self, job: SimJob, now: float) -> None:
        job.arrival = now
        self.jobs.append(job)
        self.waiting.append(job)

    def eligible(self) -> list[SimJob]:
        """Jobs not waiting behind an earlier job on their context, or on the parent they fork."""
        busy: set[str] = set()
        out = []
        for job in self.jobs:
            blocked = job.ctx.context_id in busy or (job.fork_from is not None and job.fork_from.context_id in busy)
            if not blocked and not job.aborted:
                out.append(job)
            busy.add(job.ctx.context_id)
        return out

    def reads(self, context_id: str) -> bool:
        """A job works on the context, or a pending fork will read it."""
        return any(
            j.ctx.context_id == context_id or (j.fork_from and j.fork_from.context_id == context_id) for j in self.jobs
        )

    def plan(self, now: float) -> StepPlan:
        """The next step (blocks reserved and counted computed as it is planned)."""
        self._now = now
        self._ready = set(self.eligible())
        self._failed = []
        steps = plan_step(
            self, self.running, self.waiting, self.rules, lambda j: self.order_key(j, now), now < self._contended_until
        )
        if steps.limited:
            self._contended_until = now + CONTENTION_S
        plan = StepPlan(failed=self._failed)
        for grant in steps.grants:
            job, n = grant.job, grant.num_new
            if job.decoding and n == 1 and job.ctx.num_computed == job.ctx.num_tokens:
                plan.rows.append(job)
            else:
                plan.chunks.append((job, n, job.ctx.num_computed - n))
        return plan

    # --- plan.Owner ---------------------------------------------------------------------------

    def ready(self, job: SimJob) -> bool:
        return job in self._ready

    def need(self, job: SimJob) -> int:
        computed = job.ctx.num_computed if job.fork_from is None else job.fork_from.num_computed  # after `start`
        return max(0, job.end - computed)

    def decoding(self, job: SimJob) -> bool:
        return job.max_tokens > 0 and self.ready(job) and self.need(job) <= 1

    def start(self, job: SimJob) -> bool:
        if job.fork_from is not None:
            self.num_reused_tokens += self.kv.share(job.ctx, job.fork_from)
            job.fork_from = None
        return True

    def handoff(self, job: SimJob, num_new: int) -> SimJob | None:
        return None  # a generation's job carries its prompt: its last chunk samples

    def reserve(self, job: SimJob, num_new: int) -> bool:
        if job not in self.running and not self._admits(job):
            return False
        try:
            self.kv.compute(job.ctx, num_new)
        except OutOfBlocks:
            return False
        return True

    def reclaim_idle(self, keep: set[str]) -> bool:
        return self.kv.reclaim_idle(self.kv.num_free + 1, keep) > 0

    def truncate(self, job: SimJob) -> bool:
        if all(self.kv.refs[b] > 1 for b in job.ctx.blocks):
            return False  # releasing would free nothing
        return self.kv.release(job.ctx) > 0

    def preempt(self, job: SimJob) -> None:
        self.kv.release(job.ctx)
        self.num_preemptions += 1

    def reject(self, job: SimJob) -> None:
        self._failed.append(job)
        self.finish(job, self._now)
        self._ready = set(self.eligible())

    def _admits(self, job: SimJob) -> bool:
        """vLLM's admission: the blocks of the job's whole prefill are free, besides what admitted
        prefills still need and, while running rows grow, a 1% watermark."""
        kv = self.kv
        need = kv.blocks_for(job.ctx, self.need(job))
        need += sum(kv.blocks_for(j.ctx, self.need(j)) for j in self.running if not self._decodes(j))
        growing = any(j.decoding for j in self.running)
        return need + (self.watermark if growing else 0) <= kv.num_free

    def _decodes(self, job: SimJob) -> bool:
        """A running generation that makes one token a step (no prompt left to compute)."""
        return job.decoding and job.ctx.num_computed == job.ctx.num_tokens - 1

    # --- after a step -------------------------------------------------------------------------

    def apply(self, plan: StepPlan, now: float) -> tuple[list[SimJob], int]:
        """After the step's time passed: sampled tokens join their contexts. Returns the jobs that
        sampled a token this step and the number of prefill tokens computed."""
        sampled = list(plan.rows)
        num_prefill = 0
        for job, num, cached in plan.chunks:
            num_prefill += num
            job.num_computed_tokens += num
            if job.max_tokens > 0 and cached + num == job.ctx.num_tokens:
                sampled.append(job)  # a generation's prompt (or its recomputed context) ends: it samples
        for job in sampled:
            job.ctx.num_tokens += 1
            job.num_generated += 1
        return sampled, num_prefill

    def finish(self, job: SimJob, now: float) -> None:
        for jobs in (self.jobs, self.running, self.waiting):
            if job in jobs:
                jobs.remove(job)
        if all(j.ctx is not job.ctx for j in self.jobs):
            job.ctx.busy = False
        job.ctx.last_used = now
