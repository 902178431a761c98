"""The simulated engine's scheduler plans with the builtin engine's planner: its ordering policy
with aging, its contention window and its rejection on the virtual clock (SimScheduler alone)."""

from __future__ import annotations

import itertools

from parrot.engine.sched.plan import CONTENTION_S, StepRules
from parrot.engine.sched.policy import make_priority
from parrot.protocol.objective import Objective
from parrot.sim.kv import BlockTable
from parrot.sim.scheduler import SimJob, SimScheduler, StepPlan

LAT, TPUT = Objective.LATENCY, Objective.THROUGHPUT


class Sim:
    def __init__(self, rules: StepRules, num_blocks: int = 64, aging_s: float = 5.0) -> None:
        self.kv = BlockTable(num_blocks, block_size=4)
        self.scheduler = SimScheduler(self.kv, rules, make_priority(aging_s))
        self.ids = itertools.count()

    def generation(self, cid: str, prompt: int, now: float, objective: Objective = TPUT, priority: int = 0) -> SimJob:
        ctx = self.kv.create(cid)
        ctx.num_tokens = prompt
        ctx.busy = True
        job = SimJob(next(self.ids), ctx, objective, priority, target=0, max_tokens=10)
        self.scheduler.add(job, now)
        return job

    def step(self, now: float) -> tuple[list[str], list[tuple[str, int]], list[str]]:
        """Plan and apply a step: (decode rows, chunks, failed)."""
        plan: StepPlan = self.scheduler.plan(now)
        self.scheduler.apply(plan, now)
        return (
            [j.context_id for j in plan.rows],
            [(j.context_id, n) for j, n, _ in plan.chunks],
            [j.context_id for j in plan.failed],
        )


def test_a_job_waiting_longer_than_aging_s_joins_the_front_tier() -> None:
    sim = Sim(StepRules(16, max_num_seqs=1), aging_s=5.0)
    sim.generation("old", 8, now=0.0)
    sim.generation("chat", 8, now=3.0, objective=LAT)
    assert sim.step(now=4.0) == ([], [("chat", 8)], [])  # latency-critical first
    sim = Sim(StepRules(16, max_num_seqs=1), aging_s=5.0)
    sim.generation("old", 8, now=0.0)
    sim.generation("chat", 8, now=3.0, objective=LAT)
    assert sim.step(now=5.0) == ([], [("old", 8)], [])  # aged: the front tier, earlier arrival


def test_after_a_lower_tier_prompt_was_held_back_steps_stay_prefill_sized_for_the_contention_window() -> None:
    rules = StepRules(16, latency_max_batched_tokens=4, latency_prefill_tokens=8, outranked_chunk_tokens=2)
    sim = Sim(rules)
    high = sim.generation("high", 4, now=0.0, priority=1)
    sim.generation("low", 40, now=0.0)
    assert sim.step(now=0.0) == ([], [("high", 4), ("low", 2)], [])  # the outranked share: 2 tokens
    sim.scheduler.finish(high, now=0.1)
    assert sim.step(now=0.1) == ([], [("low", 8)], [])  # no latency work, yet prefill-sized
    assert sim.step(now=CONTENTION_S) == ([], [("low", 16)], [])  # the window closed: the whole budget


def test_a_generation_whose_kv_fits_nowhere_fails_and_a_preempted_one_samples_in_its_recompute() -> None:
    sim = Sim(StepRules(64), num_blocks=2)
    sim.generation("huge", 12, now=0.0)
    assert sim.step(now=0.0) == ([], [], ["huge"])
    assert sim.scheduler.jobs == []
    sim = Sim(StepRules(64))
    job = sim.generation("a", 6, now=0.0)
    assert sim.step(now=0.0) == ([], [("a", 6)], [])  # the prompt's chunk samples the first token
    assert sim.step(now=0.1) == (["a"], [], [])
    sim.scheduler.preempt(job)  # as the planner does: KV dropped; it recomputes all 8 tokens
    sim.scheduler.running.remove(job)
    sim.scheduler.waiting.append(job)
    assert sim.step(now=0.2) == ([], [("a", 8)], [])
    assert [job.num_generated, job.ctx.num_tokens, job.ctx.num_computed] == [3, 9, 8]
