"""`SimEngine`: the engine contract (parrot.protocol.engine_client.EngineClient) over a simulated
device on the event loop's clock. Run on `parrot.sim.loop.VirtualTimeLoop`, each step "takes" the
cost model's time without any wall-clock wait; on a normal loop it sleeps that long for real.

Extend / Free keep the engine API's rules (the ids' 404/409/400, tokens and a generation in one
request, a context holding exactly its output) over paged KV accounting (kv.py) and the
step scheduler (scheduler.py). What is simulated: every generation samples exactly `max_tokens`
tokens (as the paper's workloads ask: EOS ignored; stop strings are not looked for), each the
token " the". Owns its contexts, jobs and counters; one step loop task per engine.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from pathlib import Path

from parrot.protocol.engine_api import (
    EngineStats,
    ExtendRequest,
    Filled,
    FreeContextRequest,
    LeaseRequest,
    TokenEvent,
    check_context_ids,
)
from parrot.protocol.engine_client import EngineUnavailable
from parrot.protocol.errors import ParrotError, conflict, not_found
from parrot.sim.cost import StepCostModel, StepShape
from parrot.sim.kv import BlockTable, SimContext
from parrot.sim.profiles import Setup
from parrot.sim.scheduler import GEN_TOKEN_ID, GEN_TOKEN_TEXT, SimJob, SimScheduler, StepPlan, order_key, step_rules


@dataclass
class SimCounters:
    """What a run did on one engine (the benchmarks read these)."""

    num_steps: int = 0
    busy_s: float = 0.0
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    peak_blocks_used: int = 0
    num_errors: int = 0


class SimEngine:
    def __init__(
        self,
        setup: Setup,
        tokenizer_folder: str | Path,
        shared_prefix_attention: bool = True,
        latency_max_batched_tokens: int | None = None,
        name: str | None = None,
    ) -> None:
        self.setup = setup
        self.model_folder = Path(tokenizer_folder)  # the manager's tokenizer (engine_model_folder)
        self.model_name = name or setup.model.name
        self.cost = StepCostModel(setup.hardware, setup.model, shared_prefix_attention)
        self.kv = BlockTable(setup.num_blocks, setup.block_size)
        latency_cap = (
            setup.latency_max_batched_tokens if latency_max_batched_tokens is None else latency_max_batched_tokens
        )
        self.scheduler = SimScheduler(self.kv, step_rules(setup, latency_cap), order_key(setup))
        self.counters = SimCounters()
        self.alive = True  # False: every request raises EngineUnavailable (tests of failover)
        self._ids = itertools.count()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._step_ms: dict[int, float] = {}
        self._tpot_ms = 0.0

    # --- the engine API ---------------------------------------------------------------------------

    async def extend(self, req: ExtendRequest) -> AsyncGenerator[TokenEvent, None]:
        self._check_alive()
        if req.score:  # a simulated engine computes no logits
            raise ParrotError("a simulated engine cannot score tokens", field="score")
        if req.sampling is None:
            yield TokenEvent(token_id=None, finish_reason="filled", filled=await self._fill(req))
            return
        check_context_ids(self.kv.contexts, req)
        source = self.kv.contexts.get(req.parent_context_id or req.context_id)
        num_tokens = (source.num_tokens if source is not None else 0) + len(req.token_ids)
        max_tokens = req.sampling.max_tokens
        if num_tokens == 0:
            raise ParrotError("empty context: nothing to generate from", field="context_id")
        self._check_fits(num_tokens, "token_ids")
        self._check_fits(num_tokens + max_tokens, "sampling.max_tokens")
        wait_for = self._create(req)
        ctx = self.kv.contexts[req.context_id]
        job = SimJob(next(self._ids), ctx, req.objective, req.priority, 0, max_tokens, fork_from=wait_for)
        job.events, job.reports_fill = asyncio.Queue(), bool(req.token_ids)
        self._enqueue(job)
        start = ctx.num_tokens
        try:
            while True:
                event = await job.events.get()
                if event.finish_reason is not None:
                    yield event.model_copy(update={"output_token_ids": [GEN_TOKEN_ID] * (ctx.num_tokens - start)})
                    return
                yield event
        finally:
            if job in self.scheduler.jobs:  # the caller closed the stream early: abort
                job.aborted = True
                self.scheduler.finish(job, self._now())

    async def _fill(self, req: ExtendRequest) -> Filled:
        job = self._add_fill(req)
        if job is None:
            ctx = self.kv.contexts[req.context_id]
            return Filled(num_tokens=ctx.num_tokens, num_filled_tokens=0)
        assert job.done is not None
        num = await job.done
        return Filled(num_tokens=job.ctx.num_tokens, num_filled_tokens=num)

    async def free(self, req: FreeContextRequest) -> None:
        self._check_alive()
        ctx = self.kv.contexts.get(req.context_id)
        if ctx is None:
            raise not_found("context", req.context_id, "context_id")
        if self.scheduler.reads(req.context_id):
            raise conflict(f"context {req.context_id!r} has work in progress", "context_id")
        self.kv.remove(req.context_id)

    async def renew_lease(self, req: LeaseRequest) -> None:
        """Leases are not modelled: a simulation's contexts end with it (a dead engine's with it)."""
        self._check_alive()

    async def stats(self) -> EngineStats:
        self._check_alive()
        jobs = self.scheduler.jobs
        running = sum(j.decoding for j in jobs)
        return EngineStats(
            model=self.model_name,
            max_model_len=self.setup.max_model_len,
            block_size=self.kv.block_size,
            num_blocks_total=self.kv.num_blocks,
            num_blocks_free=self.kv.num_free,
            num_contexts=len(self.kv.contexts),
            num_running=running,
            num_waiting=len(jobs) - running,
            recent_time_per_output_token_ms=self._tpot_ms,
            num_steps=self.counters.num_steps,
            num_prefill_tokens=self.counters.num_prefill_tokens,
            num_decode_tokens=self.counters.num_decode_tokens,
            num_reused_tokens=self.scheduler.num_reused_tokens,
            step_ms_by_num_tokens=dict(self._step_ms),
            native_kernels="none",
        )

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    # --- requests ---------------------------------------------------------------------------------

    def _check_alive(self) -> None:
        if not self.alive:
            raise EngineUnavailable(f"simulated engine {self.model_name} is down")

    def _check_fits(self, num_tokens: int, field: str) -> None:
        if num_tokens > self.setup.max_model_len:
            raise ParrotError(f"{num_tokens} tokens pass max_model_len {self.setup.max_model_len}", field=field)
        if -(-num_tokens // self.kv.block_size) > self.kv.num_blocks:
            raise ParrotError(f"{num_tokens} tokens can never fit in {self.kv.num_blocks} KV blocks", field=field)

    def _create(self, req: ExtendRequest) -> SimContext | None:
        """Create, fork or extend the context; returns the parent a fork must wait for (it has
        earlier jobs: the fork shares its KV once they are done), else None."""
        check_context_ids(self.kv.contexts, req)
        wait_for = None
        if req.parent_context_id is not None:
            parent = self.kv.contexts[req.parent_context_id]
            ctx = self.kv.create(req.context_id)
            ctx.num_tokens = parent.num_tokens
            if self.scheduler.reads(parent.context_id):
                wait_for = parent
            else:
                self.scheduler.num_reused_tokens += self.kv.share(ctx, parent)
        elif not req.append:
            self.kv.create(req.context_id)
        ctx = self.kv.contexts[req.context_id]
        self._check_fits(ctx.num_tokens + len(req.token_ids), "token_ids")
        ctx.num_tokens += len(req.token_ids)
        return wait_for

    def _add_fill(self, req: ExtendRequest) -> SimJob | None:
        wait_for = self._create(req)
        ctx = self.kv.contexts[req.context_id]
        target = ctx.num_tokens - 1  # the last token: the next request's (a generation or a fork's fill)
        if wait_for is None and ctx.num_computed >= target and not self.scheduler.reads(ctx.context_id):
            return None
        job = SimJob(next(self._ids), ctx, req.objective, req.priority, target=target, fork_from=wait_for)
        job.done = asyncio.get_running_loop().create_future()
        self._enqueue(job)
        return job

    def _enqueue(self, job: SimJob) -> None:
        job.ctx.busy = True
        self.scheduler.add(job, self._now())
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"sim-engine-{self.model_name}")
        assert self._wake is not None
        self._wake.set()

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    # --- the step loop ----------------------------------------------------------------------------

    async def _loop(self) -> None:
        assert self._wake is not None
        while True:
            if not self.scheduler.jobs:
                self._wake.clear()
                await self._wake.wait()
                continue
            plan = self.scheduler.plan(self._now())
            for job in plan.failed:
                self.counters.num_errors += 1
                self._end(job, TokenEvent(token_id=None, finish_reason="error", error="out of KV blocks"))
            if not plan.rows and not plan.chunks:
                if not plan.failed:
                    raise RuntimeError(f"engine {self.model_name}: a plan with work waiting computes nothing")
                continue
            shape = plan.shape()
            if shape.num_tokens:  # else only fills with nothing left to compute: they end now
                step_s = self.cost.step_s(shape)
                used = self.kv.num_blocks - self.kv.num_free
                self.counters.peak_blocks_used = max(self.counters.peak_blocks_used, used)
                await asyncio.sleep(step_s)
                self._record(shape, step_s, bool(plan.rows))
            self._apply(plan)

    def _apply(self, plan: StepPlan) -> None:
        now = self._now()
        sampled, num_prefill = self.scheduler.apply(plan, now)
        self.counters.num_prefill_tokens += num_prefill
        self.counters.num_decode_tokens += len(sampled)
        for job, _, _ in plan.chunks:
            if job.max_tokens == 0 and job.ctx.num_computed >= job.target:
                self._end(job, None)
        for job in sampled:
            if job.aborted:
                continue
            assert job.events is not None
            done = job.num_generated >= job.max_tokens
            event = TokenEvent(token_id=GEN_TOKEN_ID, text=GEN_TOKEN_TEXT, finish_reason="length" if done else None)
            if job.reports_fill and job.num_generated == 1:
                # The prompt's last token is the generation's, as in the builtin engine.
                num_filled = max(0, job.num_computed_tokens - 1)
                filled = Filled(num_tokens=job.ctx.num_tokens - 1, num_filled_tokens=num_filled)
                event = event.model_copy(update={"filled": filled})
            if done:
                self._end(job, event)
            else:
                job.events.put_nowait(event)

    def _end(self, job: SimJob, event: TokenEvent | None) -> None:
        self.scheduler.finish(job, self._now())
        if job.done is not None and not job.done.done():
            if event is not None and event.error:
                job.done.set_exception(ParrotError(event.error, status=507, field="token_ids"))
            else:
                job.done.set_result(job.num_computed_tokens)
        if job.events is not None and event is not None:
            job.events.put_nowait(event)

    def _record(self, shape: StepShape, step_s: float, decoding: bool) -> None:
        self.counters.num_steps += 1
        self.counters.busy_s += step_s
        ms = step_s * 1000.0
        bucket = 1 << (shape.num_tokens - 1).bit_length()
        old = self._step_ms.get(bucket)
        self._step_ms[bucket] = ms if old is None else 0.8 * old + 0.2 * ms
        if decoding:
            self._tpot_ms = ms if self._tpot_ms == 0 else 0.8 * self._tpot_ms + 0.2 * ms
