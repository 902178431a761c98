"""LLMEngine, the engine core: request validation, the builtin engine's state and its compute loop thread.

A step: schedule (lock held); the forward pass and sampling (no lock: no request can touch a
running context, a free of a busy context waits for its work to end); the engine core applies the
sampled tokens (lock held); the output processor detokenizes, matches stop strings and builds the
events (`output.py`, no lock); finished generations end (lock held, only when some did); then the
step's events go out in one `hand_off` call (no lock).

Ownership: every field below `_cv` is touched only with `_cv` held, except the model runner's
forward pass and the output processor's work on the step's generations (their decoders and stop
windows belong to the loop thread). The loop blocks on `_cv` when there is no work; submissions
notify it. Beside another started engine, a loop thread idle `IDLE_EXIT_S` ends, its OpenMP team
with it (an idle team makes the other's steps ~2x slower; openmp.py); the next request starts one.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch

from parrot.engine.config import EngineConfig
from parrot.engine.constraints import Grammars
from parrot.engine.generation import append_token, begin_generation, end_generations
from parrot.engine.kv.block_pool import BlockPool
from parrot.engine.kv.cache import KVCache
from parrot.engine.kv.context import Context, ContextTable
from parrot.engine.model.llama import StepInterrupted
from parrot.engine.model.loader import load_model, resolve_model_folder
from parrot.engine.model_setup import eos_ids, num_kv_blocks, set_up_model
from parrot.engine.openmp import engine_started, others_started, passing_thread
from parrot.engine.output import RowOutput, render
from parrot.engine.runner import ModelRunner
from parrot.engine.sched.job import Job, JobEvent, JobKind, ScheduledSeq, Sink, StepEvents, StepPlan, deliver
from parrot.engine.sched.scheduler import Scheduler
from parrot.engine.trace import StepMeter, StepRecord
from parrot.protocol.engine_api import (
    ContextInfo,
    EngineStats,
    ExtendRequest,
    FreeContextRequest,
    TokenEvent,
    check_token_ids,
)
from parrot.protocol.errors import ParrotError, not_found
from parrot.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
IDLE_EXIT_S = 0.5  # a loop thread with no work this long ends beside another engine (module docstring)


class LLMEngine:
    @passing_thread  # start-up's OpenMP workers end with it: the loop thread's team is the only one
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.model_folder: Path = resolve_model_folder(config.model)
        self.model_name = config.name or (config.model if not Path(config.model).exists() else self.model_folder.name)
        dtype = DTYPES[config.dtype]
        self.model = load_model(self.model_folder, dtype)
        setup = set_up_model(self.model, config, dtype)
        native, self.native_kernels, self.batch_invariant = setup.native, setup.native_kernels, setup.batch_invariant
        mc = self.model.cfg
        self.tokenizer = Tokenizer(self.model_folder)
        self.max_model_len = mc.max_position_embeddings
        self.eos_ids = eos_ids(mc, self.tokenizer)
        self.grammars = Grammars(self.model_folder, mc.vocab_size, self.eos_ids)  # constrained output
        num_blocks = config.num_blocks or num_kv_blocks(mc, config.kv_cache_bytes, config.block_size, dtype)
        self.cache = KVCache(mc.num_layers, num_blocks, config.block_size, mc.num_kv_heads, mc.head_dim, dtype)
        self.pool = BlockPool(num_blocks)
        self.contexts = ContextTable(self.pool, config.block_size)  # the engine's contexts and KV blocks
        self.scheduler = Scheduler(config, self.contexts, self.max_model_len)
        backend = setup.backend(self.cache, mc)
        self.runner = ModelRunner(self.model, self.cache, backend, self.contexts, native, self.batch_invariant)
        # Each step's events in one call (loop thread, no lock); AsyncEngine's wakes each caller loop once.
        self.hand_off: Callable[[StepEvents], None] = deliver
        self._cv, self._job_ids = threading.Condition(), itertools.count()
        self._thread: threading.Thread | None = None  # the loop thread while it runs (it ends when idle)
        self._started, self._stopping, self.meter = False, False, StepMeter()
        self._aborted: set[int] = set()  # job ids to end before the next step
        self._plan_began = 0.0  # perf_counter() when the step being run was scheduled
        self._kv_tokens = 0  # while tracing: the step's sequences' lengths after it, summed

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        with self._cv:
            self._started, self._stopping = True, False
            engine_started(self, True)
            self._wake()

    def _wake(self) -> None:
        """Notify the loop thread of new work; start one if none runs (lock held)."""
        if self._started and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="parrot-engine", daemon=True)
            self._thread.start()
        self._cv.notify_all()

    def stop(self) -> None:
        with self._cv:
            self._started, self._stopping, thread = False, True, self._thread
            engine_started(self, False)
            self._cv.notify_all()
        if thread is not None:
            thread.join()
        with self._cv:  # fail what is still queued, so no caller waits forever
            for job in self.scheduler.end_all():
                job.emit(ParrotError("engine stopped", status=503))
            self.contexts.free_released(self.scheduler.busy)

    # ---- requests (any thread) ------------------------------------------------------------------
    def submit_extend(self, req: ExtendRequest, sink: Sink) -> int:
        """Queue an extend: a fill job for its tokens, a generation job for its sampling, both at
        once, so the fill's last chunk samples the first token. Validation errors raise at once and
        change nothing; constraints compile here, unlocked. Returns the job id `abort` takes (the
        generation's; a fill, once queued, runs to its end)."""
        grammar = self.grammars.check(req.sampling) if req.sampling is not None else None
        check_token_ids(req.token_ids, self.model.cfg.vocab_size)
        with self._cv:
            self.scheduler.check_extend(req)
            self.contexts.check_live(req.context_id, req.parent_context_id)
            if req.sampling is None:  # its fill only (without tokens: a fork, and no more)
                return self._enqueue_fill(req, sink).job_id
            fill = self._enqueue_fill(req, sink) if req.token_ids else None
            fork_from = req.parent_context_id if fill is None else None  # a fill made the context
            gen = self._enqueue(JobKind.GENERATE, req, sink, fork_from, sampling=req.sampling)
            begin_generation(gen, self.tokenizer, grammar)
            if fill is not None:  # the generation reports the fill; the fill's failure ends it
                fill.then, fill.sink = gen, functools.partial(self._fill_failed, fill, gen)
            return gen.job_id

    def _enqueue_fill(self, req: ExtendRequest, sink: Sink) -> Job:
        scores = [float("nan")] * len(req.token_ids) if req.score else None
        tops = [None] * len(req.token_ids) if req.score and req.top_logprobs else None
        extra = {"scores": scores, "score_tops": tops, "num_score_top": req.top_logprobs}
        return self._enqueue(JobKind.FILL, req, sink, req.parent_context_id, token_ids=list(req.token_ids), **extra)

    def _fill_failed(self, fill: Job, gen: Job, event: JobEvent) -> None:
        """The fill of a generating extend ended in an error (emitted with the lock held): the
        generation ends with it."""
        if isinstance(event, ParrotError) and not gen.finished:
            self.scheduler.finish(gen)
            self._drop_new_context(fill)  # a fork that never started leaves only a placeholder
            gen.emit(event)

    def abort(self, job_id: int) -> None:
        """Stop a generation whose reader went away: it ends at the next step with finish_reason
        "aborted" (tokens generated so far stay in the context). Unknown or finished ids: no-op."""
        with self._cv:
            self._aborted.add(job_id)
            self._wake()

    def free(self, req: FreeContextRequest) -> None:
        """Free a context and its KV blocks. One with work in progress (its jobs, a fork waiting
        to read it) is freed when that work ends; from now on it takes no new work and a second
        free is refused (404), as if it were gone. Unknown ids: 404."""
        with self._cv:
            if req.context_id not in self.contexts or req.context_id in self.contexts.releasing:
                raise not_found("context", req.context_id, "context_id")
            self.contexts.releasing.add(req.context_id)
            self.contexts.free_released(self.scheduler.busy)

    def context_ids(self, prefixes: tuple[str, ...]) -> list[str]:
        """The ids of the contexts whose id starts with one of `prefixes`."""
        with self._cv:
            return [c for c in self.contexts.contexts if c.startswith(prefixes) and c not in self.contexts.releasing]

    def stats(self) -> EngineStats:
        with self._cv:
            return EngineStats(
                model=self.model_name,
                max_model_len=self.max_model_len,
                block_size=self.config.block_size,
                num_blocks_total=self.pool.num_blocks,
                num_blocks_free=self.pool.num_free,
                num_contexts=len(self.contexts.contexts),
                num_running=len(self.scheduler.running),
                num_waiting=len(self.scheduler.waiting),
                recent_time_per_output_token_ms=self.meter.tpot_ms,
                num_steps=self.meter.num_steps,
                num_prefill_tokens=self.meter.num_prefill_tokens,
                num_decode_tokens=self.meter.num_decode_tokens,
                num_reused_tokens=self.scheduler.num_reused_tokens,
                num_preemptions=self.scheduler.num_preemptions,
                num_interrupted_steps=self.scheduler.num_interrupted_steps,
                step_ms_by_num_tokens=dict(self.meter.step_ms),
                native_kernels=self.native_kernels,
                batch_invariant=self.batch_invariant,
            )

    def start_trace(self, max_steps: int = 100_000) -> bool:
        """Record every step from now on (the most recent `max_steps`), for profiling: True; a
        trace already on (another profiler's) goes on as it was: False."""
        with self._cv:
            return self.meter.start_trace(max_steps)

    def stop_trace(self, keep: bool = False) -> list[StepRecord]:
        """The steps recorded since `start_trace`, oldest first; recording stops unless `keep`."""
        with self._cv:
            return self.meter.stop_trace(keep)

    def context_info(self, context_id: str) -> ContextInfo:
        with self._cv:
            ctx = self.contexts.contexts.get(context_id)
            if ctx is None:
                raise not_found("context", context_id, "context_id")
            return ContextInfo(
                context_id=context_id,
                parent_context_id=ctx.parent_id,
                num_tokens=ctx.num_tokens,
                num_blocks=len(ctx.block_table),
            )

    # ---- validation helpers (lock held) ------------------------------------------------------
    def _enqueue(self, kind: JobKind, req: ExtendRequest, sink: Sink, fork_from: str | None, **fields: object) -> Job:
        """Register the request's context (validated by the caller) and queue its job."""
        if req.context_id not in self.contexts:  # registered at once (a fork's placeholder until it runs)
            self.contexts.contexts[req.context_id] = Context(req.context_id, fork_from)
        job = Job(
            next(self._job_ids),
            kind,
            req.context_id,
            sink,
            req.objective,
            req.priority,
            time.monotonic(),
            fork_from=fork_from,
            **fields,  # type: ignore[arg-type]
        )
        self.scheduler.add(job)
        self._wake()
        return job

    # ---- the loop ------------------------------------------------------------------------------
    def step(self) -> bool:
        """Run one scheduled step in the calling thread (a benchmark timing steps, a test), only
        while the loop thread is not running. False, without waiting, when no work is queued."""
        if self._started:
            raise RuntimeError("LLMEngine.step() needs the loop thread stopped (call stop() first)")
        with self._cv:
            plan = self._next_plan(block=False)
            if plan is None:
                return False
            seqs = self._begin_step(plan)
        self._run_step(plan, seqs)
        return True

    def _loop(self) -> None:
        while True:
            with self._cv:
                plan = self._next_plan(block=True)
                if plan is None:  # stopping, or idle for IDLE_EXIT_S: the thread ends
                    self._thread = None
                    return
                seqs = self._begin_step(plan)
            self._run_step(plan, seqs)

    def _begin_step(self, plan: StepPlan) -> list[ScheduledSeq]:
        """The step's rows in order, after the plan's copy-on-write block copies (lock held)."""
        seqs = self.runner.row_order(plan)
        self.cache.copy_blocks(plan.block_copies)
        self.scheduler.begin_step(seqs)
        if self.meter.trace is not None:  # the keys the step's rows attend to, for the record
            self._kv_tokens = sum(self.contexts.get(s.job.context_id).num_computed + s.num_new for s in seqs)
        return seqs

    def _run_step(self, plan: StepPlan, seqs: list[ScheduledSeq]) -> None:
        """The forward pass without the lock, the core's bookkeeping under it, the output
        processor without it, finished generations under it, then one hand-off of the events."""
        t0 = time.perf_counter()
        try:
            tokens, logprobs = self.runner.run(seqs, self.scheduler.interrupt.is_set)
        except StepInterrupted:  # a higher-tier job arrived: plan again with it (nothing applied)
            with self._cv:
                self.scheduler.end_step(interrupted=True)
            return
        except Exception as exc:  # a bug or OOM in the model: fail the step's jobs, keep serving
            log.exception("engine step failed")
            with self._cv:
                for s in seqs:
                    self._abort(s.job, ParrotError(f"engine step failed: {exc}", status=500))
                self.contexts.free_released(self.scheduler.busy)
            return
        elapsed = time.perf_counter() - t0
        with self._cv:
            self.scheduler.end_step(interrupted=False)
            rows, events = self._apply(plan, seqs, tokens, logprobs, elapsed)
        for row in rows:
            render(row)
        if any(row.finish is not None for row in rows):
            with self._cv:
                end_generations(rows, self.contexts, self.scheduler)
                self.contexts.free_released(self.scheduler.busy)
        events += [(row.job.sink, row.event) for row in rows if row.event is not None]
        self.hand_off(events)
        self.meter.record(seqs, t0, elapsed, self._plan_began, self._kv_tokens)

    def _next_plan(self, block: bool) -> StepPlan | None:
        """The next plan with rows to compute; None: stopping or idle IDLE_EXIT_S beside another engine
        (blocking), idle (not)."""
        while True:
            if block and self._stopping:
                return None
            if self._aborted:
                self._end_aborted()
            if self.scheduler.has_work():
                self._plan_began = time.perf_counter()
                plan = self.scheduler.schedule()
                for job, error in plan.failed:
                    self._drop_new_context(job)
                    job.emit(error)
                # Failures ended work; a fork that started has read its parent.
                self.contexts.free_released(self.scheduler.busy)
                if plan.seqs:
                    return plan
                if plan.failed:
                    continue
            if not block or (
                not self._cv.wait(IDLE_EXIT_S)
                and not (self.scheduler.has_work() or self._aborted)
                and others_started(self)
            ):
                return None

    def _apply(
        self, plan: StepPlan, seqs: list[ScheduledSeq], tokens: list[int], logprobs: list[float], elapsed: float
    ) -> tuple[list[RowOutput], StepEvents]:
        """The engine core's half of a step's results (lock held): progress, fills that ended,
        each sampled token appended. Returns the rows for the output processor and the `filled`
        events of fills no generation follows."""
        sampled = iter(zip(tokens, logprobs, strict=True))
        rows: list[RowOutput] = []
        events: StepEvents = []
        decoding = False  # some generation took its next token (not only a fill's hand-over)
        for s in seqs:
            job, ctx = s.job, self.contexts.get(s.job.context_id)
            ctx.num_computed += s.num_new
            if job.kind is JobKind.FILL:
                job.num_filled += s.num_new - (s.sample_for is not None)  # not the handed-over token
                self._end_fill_if_done(job, events)  # before a handed-over generation appends its token
            # Prompt tokens computed: all of a fill's (a handed-over last token included) and of a
            # generation that has not sampled yet; later, all but the previous step's sampled token
            # (more than one only when a preempted context recomputes).
            prompt_started = job.kind is JobKind.FILL or job.num_generated == 0
            self.meter.num_prefill_tokens += s.num_new if prompt_started else max(0, s.num_new - 1)
            if s.sample:
                decoding = decoding or s.sample_for is None
                token, logprob = next(sampled)
                gen = s.sampler_job
                finish = append_token(gen, ctx, token, self.eos_ids, self.max_model_len)
                rows.append(RowOutput(gen, token, logprob, finish))
        for s in plan.seqs:  # fills with nothing left to compute
            if s.job.kind is JobKind.FILL:
                self._end_fill_if_done(s.job, events)
        self.contexts.free_released(self.scheduler.busy)
        self.meter.count(sum(s.num_new for s in seqs), len(rows), elapsed, decoding)
        return rows, events

    def _end_fill_if_done(self, job: Job, events: StepEvents) -> None:
        ctx = self.contexts.get(job.context_id)
        if not job.finished and ctx.num_computed >= job.target:
            self.scheduler.finish(job)
            filled = job.fill_result(ctx.num_tokens)
            if job.then is not None:  # its generation's first event says it
                job.then.filled = filled
            else:
                events.append((job.sink, TokenEvent(token_id=None, finish_reason="filled", filled=filled)))

    def _end_aborted(self) -> None:
        for job in [*self.scheduler.running, *self.scheduler.waiting]:
            if job.job_id in self._aborted:
                self.scheduler.finish(job)
                self._drop_new_context(job)  # a fork that never started leaves only a placeholder
                ended = TokenEvent(token_id=None, finish_reason="aborted", output_token_ids=job.output_token_ids)
                job.emit(ended.model_copy(update={"filled": job.filled}) if job.filled is not None else ended)
        self._aborted.clear()
        self.contexts.free_released(self.scheduler.busy)

    def _abort(self, job: Job, error: ParrotError) -> None:
        if not job.finished:
            self.scheduler.finish(job)
            job.emit(error)

    def _drop_new_context(self, job: Job) -> None:
        """A fork that failed before forking leaves only its placeholder: remove it."""
        if job.fork_from is not None and not self.scheduler.busy(job.context_id):
            self.contexts.contexts.pop(job.context_id, None)


__all__ = ["LLMEngine", "StepRecord", "TokenEvent"]
