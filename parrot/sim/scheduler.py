"""The simulated engine's step scheduler: jobs, the plan of one step, and applying it.

Mirrors the builtin engine's rules (parrot/engine/sched/scheduler.py) at the level the cost model
sees: a token budget per step (`latency_max_batched_tokens` while latency-critical work decodes,
`latency_prefill_tokens` while it only prefills, else `max_num_batched_tokens`); decode rows first,
then chunked prefill (a prompt's last chunk may run over a decode-free step by budget /
`remainder_share`; jobs below the best priority share `outranked_chunk_tokens` prompt tokens a
step); jobs ranked by objective (latency first), priority, arrival. The setups that stand for the
builtin engine set those three as its defaults; not mirrored: its contention window (prefill-sized
steps for 2 s after tiers met), aging, and interrupting a step between layers. When blocks run out
it reclaims idle contexts (least recently used), then preempts the lowest-ranked decoding job (its
KV is dropped and recomputed later). A job waits for earlier jobs on its context. Owns the job
list; `engine.py` owns the loop.
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
    admitted: bool = False  # its prefill got its blocks (scheduler._admit); False again when preempted
    fork_from: SimContext | None = None  # a fork waiting for its parent's earlier jobs
    done: asyncio.Future[int] | None = None  # a fill's: resolved with its computed tokens
    events: asyncio.Queue[TokenEvent] | None = None  # a generation's stream
    reports_fill: bool = False  # a generation whose extend had tokens: its first event says what they did

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
    # While latency-critical work only prefills (none of it decodes), a step takes up to this many
    # tokens (at least the cap); None: the full budget.
    latency_prefill_tokens: int | None = None
    # Jobs of a lower priority than the best eligible job compute at most this many prompt tokens
    # a step in all (a decode token each is not limited); None: no limit.
    outranked_chunk_tokens: int | None = None
    # In a step without decodes, a prompt whose rest exceeds the budget by at most budget / this is
    # computed whole (within max_num_batched_tokens); None: never.
    remainder_share: int | None = None


class SimScheduler:
    def __init__(self, kv: BlockTable, config: SchedulerConfig) -> None:
        self.kv = kv
        self.config = config
        self.jobs: list[SimJob] = []  # arrival order
        self.num_preemptions = 0
        self.num_reused_tokens = 0  # KV tokens forks took over from their parents
        self.watermark = max(1, kv.num_blocks // 100)  # free blocks admission leaves for decode growth

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

    def _reserved(self) -> int:
        """Blocks admitted prefills still need (admission never hands them out twice)."""
        return sum(self.kv.blocks_for(j.ctx, j.prefill_target() - j.ctx.num_computed) for j in self.jobs if j.admitted)

    def _admit(self, job: SimJob) -> bool:
        """Admit a job's whole prefill only when its blocks are free (reclaiming idle contexts),
        besides what admitted prefills still need and a 1% watermark (as vLLM admits prompts)."""
        if job.fork_from is not None:
            self.num_reused_tokens += self.kv.share(job.ctx, job.fork_from)
            job.fork_from = None
        need = self.kv.blocks_for(job.ctx, job.prefill_target() - job.ctx.num_computed) + self._reserved()
        if need + self.watermark > self.kv.num_free:
            self.kv.reclaim_idle(need + self.watermark, keep=self._in_use())
        # The watermark keeps room for running rows to grow; with none running it is not needed.
        growing = any(j.decoding and j.admitted for j in self.jobs)
        job.admitted = need + (self.watermark if growing else 0) <= self.kv.num_free
        return job.admitted

    def _in_use(self) -> set[str]:
        keep = {j.ctx.context_id for j in self.jobs}
        return keep | {j.fork_from.context_id for j in self.jobs if j.fork_from is not None}

    def preempt(self, job: SimJob) -> None:
        """Drop the job's KV: it recomputes its context (prompt and output so far) when re-admitted."""
        self.kv.release(job.ctx)
        job.admitted = False
        self.num_preemptions += 1

    def _decode_room(self, job: SimJob, decoding: list[SimJob]) -> bool:
        """A block for the row's next token: reclaim idle contexts, then preempt lower-ranked rows."""
        kv = self.kv
        if kv.blocks_for(job.ctx, 1) <= kv.num_free:
            return True
        kv.reclaim_idle(1, keep=self._in_use())
        while kv.blocks_for(job.ctx, 1) > kv.num_free:
            victims = [j for j in decoding if j is not job and j.ctx.blocks and j.rank() > job.rank()]
            if not victims:
                return False
            self.preempt(max(victims, key=SimJob.rank))
        return True

    def plan(self) -> StepPlan:
        plan = StepPlan()
        jobs = self.eligible()
        decoding = sorted(
            (j for j in jobs if j.decoding and j.admitted and j.ctx.num_computed == j.ctx.num_tokens - 1),
            key=SimJob.rank,
        )
        budget = self._budget(decoding)
        for job in decoding:
            if budget == 0:
                break
            if job.admitted and self._decode_room(job, decoding):
                self.kv.compute(job.ctx, 1)
                plan.rows.append(job)
                budget -= 1
        rows = set(plan.rows)
        prefilling = sorted(
            (j for j in jobs if j not in rows and (j.fork_from is not None or j.ctx.num_computed < j.prefill_target())),
            key=SimJob.rank,
        )
        cfg = self.config
        slack = 0
        if not decoding and cfg.remainder_share:  # prompts only: a last chunk may run over a little
            slack = max(0, min(budget // cfg.remainder_share, cfg.max_num_batched_tokens - budget))
        top = max((j.priority for j in jobs), default=0)
        outranked_left = cfg.outranked_chunk_tokens
        for job in prefilling:
            if budget <= 0:
                break
            if not job.admitted and not self._admit(job):
                break  # first come, first served: a later prompt does not overtake one that waits for room
            need = job.prefill_target() - job.ctx.num_computed
            outranked = outranked_left is not None and job.priority < top
            num = need if need <= budget + (0 if outranked else slack) else min(need, budget)
            if outranked and num > 1 and outranked_left is not None:
                num = min(num, max(outranked_left, 0))
                outranked_left -= num
            if num <= 0:
                continue
            cached = job.ctx.num_computed
            self.kv.compute(job.ctx, num)
            plan.chunks.append((job, num, cached))
            budget -= num
        if not plan.rows and not plan.chunks:
            self._unstick(jobs)
        return plan

    def _budget(self, decoding: list[SimJob]) -> int:
        """The step's tokens: the latency cap while latency-critical work decodes; while it only
        prefills, `latency_prefill_tokens` (at least the cap); else the full budget."""
        cfg = self.config
        full = cfg.max_num_batched_tokens
        if any(j.objective is Objective.LATENCY for j in decoding):
            return min(cfg.latency_max_batched_tokens, full)
        if cfg.latency_prefill_tokens is not None and any(
            j.objective is Objective.LATENCY and not j.aborted for j in self.jobs
        ):
            return min(max(cfg.latency_max_batched_tokens, cfg.latency_prefill_tokens), full)
        return full

    def _unstick(self, jobs: list[SimJob]) -> None:
        """Nothing could run: preempt the lowest-ranked job holding blocks, so the best one can;
        with no one to preempt, the best job can never fit (the engine fails it)."""
        holders = [j for j in jobs if j.ctx.blocks and j is not min(jobs, key=SimJob.rank)]
        if holders:
            self.preempt(max(holders, key=SimJob.rank))
            return
        if jobs:
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
