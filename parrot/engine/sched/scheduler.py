"""The engine's batch scheduler: which jobs run in the next step, and how many tokens each.

Owned by the engine loop thread (callers hold the engine lock). A step spends a token budget:
running jobs first in policy order (a decode costs one token, a fill or a prompt a chunk), then
waiting jobs whose dependencies are met. When the KV pool runs out, the job ranked last is
preempted (its unshared blocks freed; it recomputes later). `schedule` only plans and reserves
blocks; `LLMEngine` runs the plan and applies its results.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from parrot.engine.config import EngineConfig
from parrot.engine.kv.block_pool import OutOfBlocks
from parrot.engine.kv.context import ContextTable
from parrot.engine.sched.job import Job, JobKind, ScheduledSeq, StepPlan
from parrot.engine.sched.policy import get_policy, tier
from parrot.protocol.engine_api import ExtendRequest, check_context_ids
from parrot.protocol.errors import ParrotError
from parrot.protocol.objective import Objective

# After a better tier met a lower one (an interrupted step, a lower-tier prompt held back), steps
# stay prefill-sized this long: more such requests tend to follow the first.
CONTENTION_S = 2.0
# In a step without decodes, a prompt whose rest exceeds the budget by at most budget / this is
# computed whole (_Budget.slack), within max_num_batched_tokens.
REMAINDER_SHARE = 8


class Scheduler:
    def __init__(self, config: EngineConfig, contexts: ContextTable, max_model_len: int) -> None:
        self.config = config
        self.max_model_len = max_model_len
        self.contexts = contexts
        self.num_reused_tokens = 0  # tokens forks took from their parents since start (engine stats)
        self.num_preemptions = 0  # running jobs sent back to waiting to free blocks, since start (stats)
        self.order_key = get_policy(config.policy, config.aging_s)
        self.waiting: list[Job] = []  # admitted, not started (or preempted)
        self.running: list[Job] = []  # started: holds blocks, makes progress each step
        self.queues: dict[str, list[Job]] = {}  # per context: its jobs in submission order
        self.num_interrupted_steps = 0  # steps stopped for a higher-tier arrival, since start (stats)
        self._step_tier: tuple | None = None  # the running step's best tier, when it may be interrupted
        # Set when a job that outranks the running step arrives; the model reads it between layers.
        self.interrupt = threading.Event()
        self._contended_until = 0.0  # steps stay prefill-sized until then (see `_token_budget`)

    # ---- admission --------------------------------------------------------------------------
    def add(self, job: Job) -> None:
        self.queues.setdefault(job.context_id, []).append(job)
        self.waiting.append(job)
        if self.outranks_step(job):
            self.interrupt.set()
            self._contended_until = time.monotonic() + CONTENTION_S

    def begin_step(self, seqs: list[ScheduledSeq]) -> None:
        """The loop starts computing `seqs`. A step that computes more prompt tokens than the
        outranked share (`outranked_chunk_tokens`) may be interrupted by a job of a better tier
        than all its rows (`outranks_step`): that job's first token does not wait for a long
        prefill of work that matters less. The step is planned again, the newcomer in it."""
        self.interrupt.clear()
        cap = self.config.outranked_chunk_tokens
        prompt = sum(s.num_new for s in seqs if s.num_new > 1)
        if cap is None or prompt <= cap:
            self._step_tier = None
            return
        now = time.monotonic()
        jobs = [s.job for s in seqs] + [s.sample_for for s in seqs if s.sample_for is not None]
        self._step_tier = min(tier(self.order_key(j, now)) for j in jobs)

    def end_step(self, interrupted: bool) -> None:
        self._step_tier = None
        self.num_interrupted_steps += interrupted

    def outranks_step(self, job: Job) -> bool:
        """Whether `job` should interrupt the running step (see `begin_step`); `add` sets
        `interrupt` when it does."""
        return self._step_tier is not None and tier(self.order_key(job, time.monotonic())) < self._step_tier

    def check_extend(self, req: ExtendRequest) -> None:
        """An Extend's id and length rules against what is held and queued; raises ParrotError."""
        check_context_ids(self.contexts, req)
        source = req.parent_context_id or req.context_id
        n = len(req.token_ids)
        if source in self.contexts:
            n += self.contexts.get(source).num_tokens + sum(len(j.token_ids) for j in self.queues.get(source, []))
        if n > self.max_model_len:
            raise ParrotError(
                f"context would hold {n} tokens; the model's limit is {self.max_model_len}", field="token_ids"
            )
        if self.contexts.blocks_for(n) > self.contexts.pool.num_blocks:
            raise ParrotError(
                f"{n} tokens need more KV blocks than the pool holds "
                f"({self.contexts.pool.num_blocks} blocks of {self.config.block_size})",
                field="token_ids",
            )

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def busy(self, context_id: str) -> bool:
        """True while the context has jobs, or a pending fork reads it."""
        if self.queues.get(context_id):
            return True
        return any(j.fork_from == context_id and not j.started for j in self.waiting)

    def _ready(self, job: Job) -> bool:
        queue = self.queues[job.context_id]
        if queue[0] is not job:
            return False
        return job.fork_from is None or not self.queues.get(job.fork_from)

    # ---- planning ---------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        now = time.monotonic()
        plan = StepPlan()
        self.running.sort(key=lambda j: self.order_key(j, now))
        self.waiting.sort(key=lambda j: self.order_key(j, now))
        budget = _Budget(self._token_budget(now), self.config.outranked_chunk_tokens, self._top_tier(now))
        # Decodes first (one token each), then chunks, both in policy order. A waiting job that
        # outranks a running chunk starts before it: a long prefill of lower-ranked work does not
        # hold back a higher-ranked request that arrives while it runs.
        decodes: list[Job] = []
        chunks: list[Job] = []
        for job in self.running:
            (decodes if self._need(job) <= 1 else chunks).append(job)
        protected: set[str] = set()
        self._serve(decodes, plan, budget, protected, now)
        if not decodes and not any(self._decoding(j) for j in self.waiting):  # prompts only (`_Budget.slack`)
            budget.slack = min(budget.tokens // REMAINDER_SHARE, self.config.max_num_batched_tokens - budget.tokens)
        for job in chunks:
            self._admit(plan, budget, now, protected, above=self.order_key(job, now))
            self._serve([job], plan, budget, protected, now)
        self._admit(plan, budget, now, protected)
        if budget.limited:
            self._contended_until = now + CONTENTION_S
        return plan

    def _top_tier(self, now: float) -> tuple | None:
        """The best tier among running jobs and ready waiting ones, or None."""
        jobs = itertools.chain(self.running, (j for j in self.waiting if self._ready(j)))
        return min((tier(self.order_key(j, now)) for j in jobs), default=None)

    def _serve(self, jobs: list[Job], plan: StepPlan, budget: _Budget, protected: set[str], now: float) -> None:
        """Give running `jobs` their tokens of the step, in order."""
        for job in jobs:
            if job not in self.running or len(plan.seqs) >= self.config.max_num_seqs or budget.tokens <= 0:
                continue
            outranked = budget.outranked(self.order_key(job, now))
            need = self._need(job)
            n = budget.grant(need, outranked)
            if need and not n:
                continue  # lower-tier prompt with the outranked share spent
            handoff = self._handoff(job, n) if n < budget.room(outranked) else None
            if not self._reserve(job, n + (handoff is not None), plan, protected, may_preempt=True):
                continue
            plan.seqs.append(self._seq(job, n, handoff))
            protected.add(job.context_id)
            budget.spend(n + (handoff is not None), outranked)

    def _token_budget(self, now: float) -> int:
        """The step's token budget. Latency-critical work that decodes caps it (every step is one
        of its output tokens); latency-critical work that only prefills gets prefill-sized steps.
        Shortly after tiers met (`CONTENTION_S`), steps are prefill-sized too: a better-tier request
        that arrives mid-step then interrupts a layer of a 512-token step, not of a 2,048-token one."""
        cfg = self.config
        cap = cfg.latency_max_batched_tokens
        full = cfg.max_num_batched_tokens
        if now < self._contended_until and cfg.latency_prefill_tokens is not None:
            full = min(full, cfg.latency_prefill_tokens)
        latency = [j for j in self.running + self.waiting if j.objective == Objective.LATENCY]
        if cap is None or not latency:
            return full
        if cfg.latency_prefill_tokens is not None and not any(self._decoding(j) for j in latency):
            cap = max(cap, cfg.latency_prefill_tokens)
        return min(cap, full)

    def _decoding(self, job: Job) -> bool:
        """A generation that can run and whose prompt is computed: each step makes one of its tokens
        (also one not yet admitted, e.g. right after a fill handed its first token over)."""
        return job.kind is JobKind.GENERATE and self._ready(job) and self._need(job) <= 1

    def _admit(
        self, plan: StepPlan, budget: _Budget, now: float, protected: set[str], above: tuple | None = None
    ) -> None:
        """Start waiting jobs (sorted by the caller) that are ready, in order, while the budget
        lasts; with `above`, only those ranked before that key."""
        keys = ((j, self.order_key(j, now)) for j in self.waiting)
        # Only the (usually short) head ranked before `above` is copied, not the whole queue.
        candidates = list(itertools.takewhile(lambda jk: above is None or jk[1] < above, keys))
        for job, key in candidates:
            if budget.tokens <= 0 or len(plan.seqs) >= self.config.max_num_seqs:
                return
            if job not in self.waiting or not self._ready(job):
                continue
            if not job.started:
                error = self._start(job)
                if error is not None:
                    self._fail(job, error, plan)
                    continue
            outranked = budget.outranked(key)
            need = self._need(job)
            n = budget.grant(need, outranked)
            if need and not n:
                continue  # lower-tier prompt with the outranked share spent: it stays waiting
            handoff = self._handoff(job, n) if 0 < n < budget.room(outranked) else None
            if n and not self._reserve(job, n + (handoff is not None), plan, protected, may_preempt=False):
                return  # wait for running work to free blocks; keep the order
            self.waiting.remove(job)
            self.running.append(job)
            plan.seqs.append(self._seq(job, n, handoff))  # n == 0: nothing to compute, done this step
            protected.add(job.context_id)
            budget.spend(n + (handoff is not None), outranked)

    def _start(self, job: Job) -> ParrotError | None:
        """First admission: fork the context if asked, append the fill's tokens, set targets."""
        ctx = self.contexts.get(job.context_id)
        if job.fork_from is not None:
            parent = self.contexts.contexts.get(job.fork_from)
            if parent is None:
                return ParrotError(f"parent context {job.fork_from!r} was freed", status=404, field="parent_context_id")
            del self.contexts.contexts[job.context_id]  # the placeholder made at submission
            ctx = self.contexts.create(job.context_id, parent)
            self.num_reused_tokens += parent.num_computed  # shared KV, never computed for this fork
            job.fork_from = None
        if job.kind is JobKind.FILL:
            if len(ctx.tokens) + len(job.token_ids) > self.max_model_len:
                return ParrotError(
                    f"context would hold {len(ctx.tokens) + len(job.token_ids)} tokens, "
                    f"more than the limit {self.max_model_len}",
                    field="token_ids",
                )
            if job.scores is not None and ctx.tokens and ctx.num_computed >= len(ctx.tokens):
                return ParrotError("cannot score: the context's last token is computed already", field="score")
            job.score_from = len(ctx.tokens)
            ctx.tokens.extend(job.token_ids)
            # The last token stays uncomputed: a generation (or a fork's fill) computes it and
            # samples from its logits, so no hidden state is kept between requests.
            job.target = max(ctx.num_computed, len(ctx.tokens) - 1)
        elif not ctx.tokens:
            return ParrotError("cannot generate from an empty context: fill it first", field="context_id")
        job.started = True
        return None

    def _need(self, job: Job) -> int:
        ctx = self.contexts.get(job.context_id)
        if job.kind is JobKind.FILL:
            return max(0, job.target - ctx.num_computed)
        return len(ctx.tokens) - ctx.num_computed

    def _seq(self, job: Job, n: int, handoff: Job | None = None) -> ScheduledSeq:
        if handoff is not None:
            return ScheduledSeq(job, n + 1, True, handoff)
        ctx = self.contexts.get(job.context_id)
        sample = job.kind is JobKind.GENERATE and ctx.num_computed + n == len(ctx.tokens)
        return ScheduledSeq(job, n, sample)

    def _handoff(self, job: Job, n: int) -> Job | None:
        """The generation waiting right behind `job` on its context, if `n` more tokens finish the
        fill: the fill's last chunk then computes the final token too and samples for it."""
        if job.kind is not JobKind.FILL:
            return None
        ctx = self.contexts.get(job.context_id)
        if ctx.num_computed + n != job.target or job.target != len(ctx.tokens) - 1:
            return None
        queue = self.queues[job.context_id]
        if len(queue) < 2 or queue[0] is not job:
            return None
        nxt = queue[1]
        if nxt.kind is not JobKind.GENERATE or nxt.started or nxt.finished or nxt.fork_from is not None:
            return None
        return nxt

    def _reserve(self, job: Job, n: int, plan: StepPlan, protected: set[str], may_preempt: bool) -> bool:
        """Reserve blocks for `n` more tokens of `job`, reclaiming others' blocks if needed.

        Reclaim order: idle contexts (least recently used first), then contexts of waiting jobs
        (lowest ranked first), then, if `may_preempt`, running jobs ranked below this one. A
        reclaimed context keeps its tokens and the blocks other contexts share; the rest of its
        KV is recomputed when it is next used. A job that cannot fit even then fails.
        """
        ctx = self.contexts.get(job.context_id)
        keep = protected | {job.context_id}
        while True:
            try:
                plan.block_copies += self.contexts.reserve(ctx, ctx.num_computed + n)
                return True
            except OutOfBlocks:
                if self._reclaim(keep, job if may_preempt else None):
                    continue
                if not plan.seqs and (may_preempt or not self.running):
                    msg = f"the KV cache ({self.contexts.pool.num_blocks} blocks) cannot hold this context"
                    self._fail(job, ParrotError(msg, status=503), plan)
                return False

    def _reclaim(self, keep: set[str], preempt_below: Job | None) -> bool:
        busy = set(self.queues)
        idle = [c for c in self.contexts.contexts.values() if c.context_id not in busy and c.context_id not in keep]
        idle.sort(key=lambda c: c.last_used)
        for c in idle:
            if self.contexts.truncate_to_shared(c):
                return True
        for j in reversed(self.waiting):
            in_use = j.context_id in keep or j.context_id not in self.contexts
            if not in_use and self.contexts.truncate_to_shared(self.contexts.get(j.context_id)):
                return True
        if preempt_below is not None:
            for j in reversed(self.running):
                if j is preempt_below:
                    break
                if j.context_id not in keep:
                    self._preempt(j)
                    return True
        return False

    def _preempt(self, job: Job) -> None:
        self.num_preemptions += 1
        self.contexts.truncate_to_shared(self.contexts.get(job.context_id))
        self.running.remove(job)
        self.waiting.append(job)

    def _fail(self, job: Job, error: ParrotError, plan: StepPlan) -> None:
        plan.failed.append((job, error))
        self.finish(job)

    # ---- completion -------------------------------------------------------------------------
    def end_all(self) -> Iterator[Job]:
        """End every job (the engine stops), yielding each for its caller to tell. Lazily: telling
        a combined request's fill of its end also ends its generation, which is then skipped."""
        for job in [*self.running, *self.waiting]:
            if not job.finished:
                self.finish(job)
                yield job

    def finish(self, job: Job) -> None:
        job.finished = True
        if job.context_id in self.contexts:
            self.contexts.get(job.context_id).last_used = time.monotonic()
        for pool in (self.running, self.waiting):
            if job in pool:
                pool.remove(job)
        queue = self.queues.get(job.context_id)
        if queue and job in queue:
            queue.remove(job)
            if not queue:
                del self.queues[job.context_id]


@dataclass
class _Budget:
    """One step's tokens. Jobs of a lower tier than the step's best (`top`) share at most
    `outranked_left` of them (EngineConfig.outranked_chunk_tokens; None: no such limit), beyond
    one decode token each: someone's output is not slowed by prompts that matter less."""

    tokens: int
    outranked_left: int | None
    top: tuple | None
    limited: bool = False  # some lower-tier job got fewer prompt tokens than it needed
    # Tokens a prompt's last chunk may take beyond the budget in a step without decodes: a
    # 1,056-token prompt in 512-token steps is 544 + 512 tokens, not 512 + 512 + 32, whose third
    # step costs ~65 ms for 32 tokens on two cores (the weights are read once per step whatever
    # its size); with a decode in the step, none (its time per output token stays capped).
    slack: int = 0

    def outranked(self, key: tuple) -> bool:
        return self.outranked_left is not None and self.top is not None and tier(key) > self.top

    def room(self, outranked: bool) -> int:
        """Tokens a job may still take in this step (its last chunk: with the slack)."""
        return self.tokens if outranked else self.tokens + self.slack

    def grant(self, need: int, outranked: bool) -> int:
        """Tokens a job that needs `need` more gets now (all of them when the rest fits the slack)."""
        n = need if need <= self.room(outranked) else min(need, self.tokens)
        if outranked and n > 1:
            n = min(n, max(self.outranked_left or 0, 0))
            self.limited = self.limited or n < min(need, self.tokens)
        return n

    def spend(self, n: int, outranked: bool) -> None:
        self.tokens -= n
        if outranked and n > 1 and self.outranked_left is not None:
            self.outranked_left -= n
