"""The engine's batch scheduler: its jobs (admission, readiness, progress, completion), the
interruption of a running step, and the engine's side of step planning.

Owned by the engine loop thread (callers hold the engine lock). The rules of a step (token budget,
decodes first, tiers, chunked prefill, reclaim and preemption) are `plan.plan_step`'s; this class
is its `plan.Owner` over the engine's jobs, contexts and block pool. `schedule` only plans and
reserves blocks; `LLMEngine` runs the plan and applies its results.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from parrot.engine.config import EngineConfig
from parrot.engine.kv.block_pool import OutOfBlocks
from parrot.engine.kv.context import ContextTable
from parrot.engine.sched.job import Job, JobKind, ScheduledSeq, StepPlan
from parrot.engine.sched.plan import CONTENTION_S, StepRules, plan_step
from parrot.engine.sched.policy import get_policy, tier
from parrot.protocol.engine_api import ExtendRequest, check_context_ids
from parrot.protocol.errors import ParrotError


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
        self._contended_until = 0.0  # steps stay prefill-sized until then (plan.token_budget)
        self._plan = StepPlan()  # the plan `schedule` builds: `reserve` adds block copies, `_fail` failures

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

    def ready(self, job: Job) -> bool:
        """`plan.Owner`: first in its context's queue, and its fork parent has no queued jobs."""
        queue = self.queues[job.context_id]
        if queue[0] is not job:
            return False
        return job.fork_from is None or not self.queues.get(job.fork_from)

    # ---- planning ---------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        now = time.monotonic()
        self._plan = plan = StepPlan()
        cfg = self.config
        rules = StepRules(
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            latency_max_batched_tokens=cfg.latency_max_batched_tokens,
            latency_prefill_tokens=cfg.latency_prefill_tokens,
            outranked_chunk_tokens=cfg.outranked_chunk_tokens,
            max_num_seqs=cfg.max_num_seqs,
        )
        steps = plan_step(
            self, self.running, self.waiting, rules, lambda j: self.order_key(j, now), now < self._contended_until
        )
        plan.seqs = [self._seq(g.job, g.num_new, g.handoff) for g in steps.grants]
        if steps.limited:
            self._contended_until = now + CONTENTION_S
        return plan

    # ---- plan.Owner: the planner's questions about jobs, and its KV primitives ---------------
    def decoding(self, job: Job) -> bool:
        """A generation that can run and whose prompt is computed: each step makes one of its tokens
        (also one not yet admitted, e.g. right after a fill handed its first token over)."""
        return job.kind is JobKind.GENERATE and self.ready(job) and self.need(job) <= 1

    def start(self, job: Job) -> bool:
        if job.started:
            return True
        error = self._start(job)
        if error is not None:
            self._fail(job, error)
            return False
        return True

    def reserve(self, job: Job, num_new: int) -> bool:
        ctx = self.contexts.get(job.context_id)
        try:
            self._plan.block_copies += self.contexts.reserve(ctx, ctx.num_computed + num_new)
        except OutOfBlocks:
            return False
        return True

    def reclaim_idle(self, keep: set[str]) -> bool:
        """Idle contexts (no queued job), least recently used first: their KV that no other context
        shares. A reclaimed context keeps its tokens; the rest of its KV is recomputed when it is
        next used."""
        busy = set(self.queues)
        idle = [c for c in self.contexts.contexts.values() if c.context_id not in busy and c.context_id not in keep]
        idle.sort(key=lambda c: c.last_used)
        return any(self.contexts.truncate_to_shared(c) for c in idle)

    def truncate(self, job: Job) -> bool:
        return job.context_id in self.contexts and bool(
            self.contexts.truncate_to_shared(self.contexts.get(job.context_id))
        )

    def preempt(self, job: Job) -> None:
        self.num_preemptions += 1
        self.contexts.truncate_to_shared(self.contexts.get(job.context_id))

    def reject(self, job: Job) -> None:
        msg = f"the KV cache ({self.contexts.pool.num_blocks} blocks) cannot hold this context"
        self._fail(job, ParrotError(msg, status=503))

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

    def need(self, job: Job) -> int:
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

    def handoff(self, job: Job, n: int) -> Job | None:
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

    def _fail(self, job: Job, error: ParrotError) -> None:
        self._plan.failed.append((job, error))
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
