"""Tiers in the engine's scheduler (unit tests, no model): a waiting job that outranks running
prefill starts before it, lower tiers compute few prompt tokens while a better tier runs, and a long
step of lower-tier work may be interrupted by a better arrival."""

from __future__ import annotations

import pytest
from sched_harness import Harness

from parrot.engine.config import EngineConfig
from parrot.engine.sched import scheduler
from parrot.engine.sched.job import JobKind
from parrot.protocol.objective import Objective

LAT = Objective.LATENCY


def test_a_better_tier_arrival_starts_before_running_lower_tier_prefill() -> None:
    h = Harness(outranked_chunk_tokens=None)
    for i in range(3):
        h.job(JobKind.FILL, f"flood{i}", tokens=3000, priority=0)
    assert h.step() == {"flood0": 2048}
    h.job(JobKind.FILL, "victim", tokens=100, priority=2)
    # The victim's prompt goes first: the running flood chunk does not take the budget ahead of it.
    assert h.step() == {"victim": 99, "flood0": 951, "flood1": 998}


@pytest.mark.parametrize(("contention_s", "after"), [(2.0, 512), (0.0, 2048)])
def test_lower_tiers_share_a_few_prompt_tokens_while_a_better_tier_runs(
    monkeypatch: pytest.MonkeyPatch, contention_s: float, after: int
) -> None:
    monkeypatch.setattr(scheduler, "CONTENTION_S", contention_s)
    h = Harness(outranked_chunk_tokens=4)
    for i in range(2):
        h.job(JobKind.FILL, f"flood{i}", tokens=3000, priority=0)
    h.job(JobKind.FILL, "victim", tokens=100, priority=2)
    assert h.step() == {"victim": 99, "flood0": 4}  # 4 in all, not 4 each
    # The victim's fill ended: the flood has the step again, prefill-sized (latency_prefill_tokens)
    # while the contention is recent, so that a next better-tier arrival interrupts a short layer.
    assert h.step() == {"flood0": after}


def test_the_same_tier_shares_the_budget_in_order() -> None:
    h = Harness(outranked_chunk_tokens=4)
    h.job(JobKind.FILL, "a", tokens=1500, priority=1)
    h.job(JobKind.FILL, "b", tokens=1500, priority=1)
    assert h.step() == {"a": 1499, "b": 549}


@pytest.mark.parametrize(
    ("arrival_priority", "step_tokens", "interrupts"),
    [(2, 3000, True), (0, 3000, False), (2, 4, False)],  # better tier; same tier; a short step
)
def test_a_long_lower_tier_step_is_interrupted_only_by_a_better_tier(
    arrival_priority: int, step_tokens: int, interrupts: bool
) -> None:
    h = Harness(outranked_chunk_tokens=4)
    h.job(JobKind.FILL, "flood", tokens=step_tokens + 1, priority=0)
    plan = h.scheduler.schedule()
    h.scheduler.begin_step(plan.seqs)
    newcomer = h.job(JobKind.FILL, "victim", tokens=10, priority=arrival_priority)
    assert [h.scheduler.outranks_step(newcomer), h.scheduler.interrupt.is_set()] == [interrupts, interrupts]
    h.scheduler.end_step(interrupted=interrupts)
    assert [h.scheduler.outranks_step(newcomer), h.scheduler.num_interrupted_steps] == [False, int(interrupts)]


def test_config_rejects_a_non_positive_outranked_share() -> None:
    with pytest.raises(ValueError, match="outranked_chunk_tokens"):
        EngineConfig(outranked_chunk_tokens=0)


def test_latency_and_throughput_work_of_one_priority_share_a_tier() -> None:
    # A chat beside a map stage a person awaits (both priority 1): the maps' prompts fill the step
    # (prefill-sized while the latency work only prefills: 512 tokens), not the outranked share.
    h = Harness(outranked_chunk_tokens=4, latency_max_batched_tokens=128)
    h.job(JobKind.FILL, "chat", objective=LAT, tokens=10, priority=1)
    h.job(JobKind.FILL, "maps", objective=Objective.THROUGHPUT, tokens=3000, priority=1)
    assert h.step() == {"chat": 9, "maps": 503}
    # Nobody awaits the maps (priority 0): a lower tier, 4 prompt tokens a step in all.
    h = Harness(outranked_chunk_tokens=4, latency_max_batched_tokens=128)
    h.job(JobKind.FILL, "chat", objective=LAT, tokens=10, priority=1)
    h.job(JobKind.FILL, "maps", objective=Objective.THROUGHPUT, tokens=3000, priority=0)
    assert h.step() == {"chat": 9, "maps": 4}
