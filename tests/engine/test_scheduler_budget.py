"""The step's token budget: the latency cap holds while latency-critical work decodes; while it
only prefills, steps take `latency_prefill_tokens` (scheduler unit tests, no model)."""

from __future__ import annotations

import itertools

import pytest

from parrot.engine.config import EngineConfig
from parrot.engine.kv.block_pool import BlockPool
from parrot.engine.kv.context import Context, ContextTable
from parrot.engine.sched.job import Job, JobKind
from parrot.engine.sched.scheduler import Scheduler
from parrot.protocol.objective import Objective

LAT, TPUT = Objective.LATENCY, Objective.THROUGHPUT


class Harness:
    def __init__(self, **config: object) -> None:
        cfg = EngineConfig(max_num_batched_tokens=2048, **config)  # type: ignore[arg-type]
        self.contexts = ContextTable(BlockPool(4096), 16)
        self.scheduler = Scheduler(cfg, self.contexts, 8192)
        self.ids = itertools.count()

    def job(self, kind: JobKind, cid: str, objective: Objective, tokens: int = 0, fork_from: str | None = None) -> Job:
        if cid not in self.contexts:
            self.contexts.contexts[cid] = Context(cid, fork_from)
        job = Job(next(self.ids), kind, cid, lambda e: None, objective, 0, 0.0, fork_from=fork_from)
        job.token_ids = list(range(tokens))
        self.scheduler.add(job)
        return job

    def fill(self, cid: str, objective: Objective, tokens: int) -> Job:
        return self.job(JobKind.FILL, cid, objective, tokens)

    def generate(self, cid: str, objective: Objective, fork_from: str | None = None) -> Job:
        return self.job(JobKind.GENERATE, cid, objective, fork_from=fork_from)

    def plan_tokens(self) -> list[int]:
        return [s.num_new for s in self.scheduler.schedule().seqs]

    def computed(self, cid: str, num_tokens: int) -> None:
        """A context holding `num_tokens` tokens, all computed but the last (as after a fill)."""
        ctx = self.contexts.create(cid)
        ctx.tokens = list(range(num_tokens))
        self.contexts.reserve(ctx, num_tokens)
        ctx.num_computed = num_tokens - 1


def test_a_lone_latency_prefill_takes_prefill_sized_steps() -> None:
    h = Harness(latency_max_batched_tokens=128, latency_prefill_tokens=512)
    h.fill("a", LAT, 1300)
    h.generate("a", LAT)  # queued behind its fill: not decoding yet
    assert h.plan_tokens() == [512]


@pytest.mark.parametrize(
    ("decode_objective", "expected"),
    [(LAT, [1, 127]), (TPUT, [1, 511])],  # the decode's one token, then as much of the prompt as allowed
)
def test_only_a_latency_critical_decode_caps_the_step(decode_objective: Objective, expected: list[int]) -> None:
    h = Harness(latency_max_batched_tokens=128, latency_prefill_tokens=512)
    h.computed("d", 40)
    h.generate("d", decode_objective)
    h.fill("p", LAT, 1300)
    assert h.plan_tokens() == expected


def test_a_fork_generate_ready_to_decode_counts_as_decoding() -> None:
    h = Harness(latency_max_batched_tokens=128, latency_prefill_tokens=512)
    h.computed("parent", 40)
    h.generate("child", LAT, fork_from="parent")  # forks from a computed parent: decodes at once
    h.fill("p", LAT, 1300)
    assert h.plan_tokens() == [1, 127]


def test_a_fork_of_a_parent_still_filling_is_not_decoding() -> None:
    h = Harness(latency_max_batched_tokens=128, latency_prefill_tokens=512)
    h.fill("parent", LAT, 1300)
    h.generate("child", LAT, fork_from="parent")
    assert h.plan_tokens() == [512]


@pytest.mark.parametrize(
    ("prefill_tokens", "cap", "expected"),
    [(None, 128, 128), (64, 128, 128), (4096, 128, 2048)],  # off; never below the cap; never above the budget
)
def test_prefill_budget_bounds(prefill_tokens: int | None, cap: int, expected: int) -> None:
    h = Harness(latency_max_batched_tokens=cap, latency_prefill_tokens=prefill_tokens)
    h.fill("a", LAT, 3000)
    assert h.plan_tokens() == [expected]


def test_without_latency_work_the_whole_budget_is_used() -> None:
    h = Harness(latency_max_batched_tokens=128, latency_prefill_tokens=512)
    h.fill("a", TPUT, 3000)
    assert h.plan_tokens() == [2048]


def test_config_rejects_a_non_positive_prefill_budget() -> None:
    with pytest.raises(ValueError, match="latency_prefill_tokens"):
        EngineConfig(latency_prefill_tokens=0)
