"""The pure step planner (parrot.engine.sched.plan) on hand-built jobs and a hand-built KV: exact
budgets, grants, tiers, the one-eighth rule, and the order of reclaim, preemption and rejection."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import pytest

from parrot.engine.sched.plan import StepRules, plan_step, remainder_slack, token_budget
from parrot.engine.sched.policy import make_priority
from parrot.protocol.objective import Objective

LAT, TPUT = Objective.LATENCY, Objective.THROUGHPUT
IDS = itertools.count()
KEY = make_priority(math.inf)


@dataclass(eq=False)
class FakeJob:
    context_id: str
    need: int  # tokens left before it samples or ends (grows by what a reclaim drops)
    priority: int = 0
    objective: Objective = TPUT
    generates: bool = False
    ready: bool = True
    computed: int = 0  # KV tokens its context holds
    handoff: FakeJob | None = None  # sampled for by its last chunk
    startable: bool = True
    arrival: float = 0.0

    def __post_init__(self) -> None:
        self.job_id = next(IDS)


class FakeOwner:
    """Blocks of 4 tokens; a context holds the blocks of its computed tokens plus what `reserve` adds.
    Every KV action is logged in order."""

    def __init__(self, num_blocks: int, running: list[FakeJob], waiting: list[FakeJob], idle: dict[str, int]) -> None:
        self.running = running
        self.waiting = waiting
        self.idle = dict(idle)  # context -> blocks, least recently used first
        self.held = {j.context_id: -(-j.computed // 4) for j in running + waiting}
        self.free = num_blocks - sum(self.held.values()) - sum(self.idle.values())
        assert self.free >= 0
        self.log: list[str] = []

    def ready(self, job: FakeJob) -> bool:
        return job.ready

    def need(self, job: FakeJob) -> int:
        return job.need

    def decoding(self, job: FakeJob) -> bool:
        return job.generates and job.ready and job.need <= 1

    def start(self, job: FakeJob) -> bool:
        if not job.startable:
            self.log.append(f"fail {job.context_id}")
            self.waiting.remove(job)
        return job.startable

    def handoff(self, job: FakeJob, num_new: int) -> FakeJob | None:
        return job.handoff if num_new == job.need else None

    def reserve(self, job: FakeJob, num_new: int) -> bool:
        more = -(-(job.computed + num_new) // 4) - self.held[job.context_id]
        if more > self.free:
            return False
        self.free -= max(more, 0)
        self.held[job.context_id] += max(more, 0)
        return True

    def reclaim_idle(self, keep: set[str]) -> bool:
        for cid, blocks in self.idle.items():
            if cid not in keep:
                self.log.append(f"reclaim {cid}")
                self.free += blocks
                del self.idle[cid]
                return True
        return False

    def _drop(self, job: FakeJob, what: str) -> bool:
        if not self.held[job.context_id]:
            return False
        self.log.append(f"{what} {job.context_id}")
        self.free += self.held[job.context_id]
        self.held[job.context_id] = 0
        job.need += job.computed
        job.computed = 0
        return True

    def truncate(self, job: FakeJob) -> bool:
        return self._drop(job, "truncate")

    def preempt(self, job: FakeJob) -> None:
        self._drop(job, "preempt")

    def reject(self, job: FakeJob) -> None:
        self.log.append(f"reject {job.context_id}")
        for jobs in (self.running, self.waiting):
            if job in jobs:
                jobs.remove(job)


def plan(
    rules: StepRules,
    running: list[FakeJob],
    waiting: list[FakeJob] | None = None,
    num_blocks: int = 1000,
    idle: dict[str, int] | None = None,
    contended: bool = False,
) -> tuple[list[tuple[str, int]], FakeOwner, bool]:
    """The grants as (context, tokens: a handoff's token included), the owner, and `limited`."""
    owner = FakeOwner(num_blocks, running, waiting or [], idle or {})
    out = plan_step(owner, owner.running, owner.waiting, rules, lambda j: KEY(j, 0.0), contended)
    grants = [(g.job.context_id, g.num_new + (g.handoff is not None)) for g in out.grants]
    return grants, owner, out.limited


def names(jobs: list[FakeJob]) -> list[str]:
    return [j.context_id for j in jobs]


RULES = StepRules(max_num_batched_tokens=2048, latency_max_batched_tokens=128, latency_prefill_tokens=512)


@pytest.mark.parametrize(
    ("rules", "latency_work", "latency_decodes", "contended", "expected"),
    [
        (RULES, False, False, False, 2048),  # no latency work: the whole budget
        (RULES, True, True, False, 128),  # latency work decodes: the cap
        (RULES, True, False, False, 512),  # latency work only prefills: prefill-sized
        (RULES, False, False, True, 512),  # the contention window: prefill-sized
        (RULES, True, True, True, 128),  # ... and never above the cap
        (StepRules(2048, 128, None), True, False, False, 128),  # no prefill size: the cap holds
        (StepRules(2048, 128, None), False, False, True, 2048),  # ... and no contention size
        (StepRules(2048, 128, 64), True, False, False, 128),  # the prefill size is at least the cap
        (StepRules(2048, 128, 4096), True, False, False, 2048),  # and at most the budget
        (StepRules(2048, None, 512), True, True, False, 2048),  # no cap
    ],
)
def test_token_budget_under_each_rule(
    rules: StepRules, latency_work: bool, latency_decodes: bool, contended: bool, expected: int
) -> None:
    assert token_budget(rules, latency_work, latency_decodes, contended) == expected


@pytest.mark.parametrize(
    ("rules", "budget", "expected"),
    [(RULES, 512, 64), (RULES, 2048, 0), (StepRules(600), 512, 64), (StepRules(540), 512, 28), (RULES, 7, 0)],
)
def test_remainder_slack_is_an_eighth_of_the_budget_within_the_step_limit(
    rules: StepRules, budget: int, expected: int
) -> None:
    assert remainder_slack(rules, budget) == expected
    assert remainder_slack(StepRules(2048, remainder_share=None), budget) == 0


def test_decodes_first_then_chunks_in_rank_order_a_better_waiting_job_before_a_running_chunk() -> None:
    prompt = FakeJob("prompt", need=150, arrival=0.0)
    decode = FakeJob("decode", need=1, generates=True, arrival=1.0)
    urgent = FakeJob("urgent", need=30, priority=1, arrival=2.0)
    late = FakeJob("late", need=30, arrival=3.0)
    grants, owner, limited = plan(StepRules(100), [decode, prompt], [late, urgent])
    assert [grants, limited] == [[("decode", 1), ("urgent", 30), ("prompt", 69)], False]
    assert [names(owner.running), names(owner.waiting)] == [["prompt", "decode", "urgent"], ["late"]]


def test_lower_tiers_share_the_outranked_tokens_beside_their_one_token_decodes() -> None:
    high = FakeJob("high", need=1, priority=1, generates=True)
    low_decode = FakeJob("low_decode", need=1, generates=True)
    low1, low2 = FakeJob("low1", need=500), FakeJob("low2", need=500)
    rules = StepRules(100, outranked_chunk_tokens=4)
    grants, _, limited = plan(rules, [low1, low2, low_decode, high])
    assert [grants, limited] == [[("high", 1), ("low_decode", 1), ("low1", 4)], True]
    # One tier: the budget in order, nothing held back.
    same = [FakeJob("a", need=60, priority=1), FakeJob("b", need=60, priority=1)]
    assert plan(rules, same)[0::2] == ([("a", 60), ("b", 40)], False)


def test_a_waiting_lower_tier_prompt_takes_the_outranked_share_or_stays_waiting() -> None:
    rules = StepRules(100, outranked_chunk_tokens=4)
    high = FakeJob("high", need=1, priority=2, generates=True)
    first, second = FakeJob("first", need=50, arrival=1.0), FakeJob("second", need=50, arrival=2.0)
    grants, owner, limited = plan(rules, [high], [second, first])
    assert [grants, names(owner.running), names(owner.waiting), limited] == [
        [("high", 1), ("first", 4)],
        ["high", "first"],
        ["second"],
        True,
    ]


@pytest.mark.parametrize(
    ("need", "decode", "share", "expected"),
    [
        (576, False, 8, [576]),  # the rest fits budget + budget / 8: all of it
        (577, False, 8, [512]),  # one more: a full chunk, the rest later
        (576, False, None, [512]),  # no remainder rule
        (540, True, 8, [1, 511]),  # a decode in the step: no slack
    ],
)
def test_a_prompts_last_chunk_runs_over_a_decode_free_step_by_an_eighth(
    need: int, decode: bool, share: int | None, expected: list[int]
) -> None:
    rules = StepRules(2048, 128, 512, remainder_share=share)
    jobs = [FakeJob("p", need=need, objective=LAT)]
    if decode:
        jobs.append(FakeJob("d", need=1, generates=True, arrival=-1.0))  # throughput: the budget stays 512
    grants, _, _ = plan(rules, jobs)
    assert [n for _, n in grants] == expected


def test_a_ready_waiting_decode_denies_the_slack() -> None:
    waiting_decode = FakeJob("w", need=1, generates=True, ready=False)
    grants, _, _ = plan(StepRules(2048, 128, 512), [FakeJob("p", need=570, objective=LAT)], [waiting_decode])
    assert grants == [("p", 570)]  # not ready: not decoding, the slack holds
    waiting_decode = FakeJob("w", need=1, generates=True, arrival=5.0)
    grants, _, _ = plan(
        StepRules(2048, 128, 512, max_num_seqs=1), [FakeJob("p", need=570, objective=LAT)], [waiting_decode]
    )
    assert grants == [("p", 512)]


def test_the_handoff_token_is_spent_from_the_budget_and_max_num_seqs_bounds_the_step() -> None:
    gen = FakeJob("g", need=0)
    fill = FakeJob("f", need=10, handoff=gen)
    other = FakeJob("o", need=200, arrival=1.0)
    assert plan(StepRules(100), [fill, other])[0] == [("f", 11), ("o", 89)]
    decodes = [FakeJob(f"d{i}", need=1, generates=True, arrival=i) for i in range(3)]
    assert plan(StepRules(100, max_num_seqs=2), decodes)[0] == [("d0", 1), ("d1", 1)]


def test_kv_room_comes_from_idle_contexts_then_waiting_ones_then_the_lowest_ranked_running_job() -> None:
    # 5 blocks of 4 tokens: idle "old" holds 1, waiting "w" 1, running "low" 2; 1 free.
    top = FakeJob("top", need=12, priority=2)
    mid = FakeJob("mid", need=6, priority=1)
    low = FakeJob("low", need=10, computed=8, arrival=0.0)
    w = FakeJob("w", need=20, computed=4, ready=False, arrival=1.0)
    grants, owner, _ = plan(StepRules(100), [low, mid, top], [w], num_blocks=5, idle={"old": 1})
    # top needs 3 blocks: the idle context, then the waiting one's; mid needs 2: low (ranked last,
    # not yet planned) is preempted; low, waiting again, then needs all 5 and admission never preempts.
    assert grants == [("top", 12), ("mid", 6)]
    assert owner.log == ["reclaim old", "truncate w", "preempt low"]
    assert [names(owner.running), names(owner.waiting), low.need] == [["top", "mid"], ["w", "low"], 18]


def test_only_a_running_job_ranked_below_and_not_yet_planned_is_preempted() -> None:
    top = FakeJob("top", need=1, priority=2, generates=True, computed=4)  # its next token needs a block
    low = FakeJob("low", need=1, generates=True, computed=3)  # served after top: still preemptible
    grants, owner, _ = plan(StepRules(100), [top, low], num_blocks=2)
    assert [grants, owner.log] == [[("top", 1)], ["preempt low"]]
    # Decodes go first: "dec" finds no job ranked below it and is skipped (something is planned);
    # the chunk of "high" then preempts it, never the decode planned before ("first").
    high = FakeJob("high", need=4, priority=2, computed=4)
    first = FakeJob("first", need=1, priority=1, generates=True, computed=3)
    dec = FakeJob("dec", need=1, generates=True, computed=4)
    grants, owner, _ = plan(StepRules(100), [dec, first, high], num_blocks=3)
    assert [grants, owner.log, names(owner.waiting)] == [[("first", 1), ("high", 4)], ["preempt dec"], ["dec"]]


def test_a_job_that_fits_nowhere_with_nothing_else_planned_is_rejected() -> None:
    grants, owner, _ = plan(StepRules(100), [FakeJob("huge", need=100)], num_blocks=4)
    assert [grants, owner.log, owner.running] == [[], ["reject huge"], []]
    grants, owner, _ = plan(StepRules(100), [], [FakeJob("huge", need=100)], num_blocks=4)
    assert [grants, owner.log, owner.waiting] == [[], ["reject huge"], []]


def test_admission_stops_at_the_first_job_that_does_not_fit_and_keeps_the_order() -> None:
    decode = FakeJob("d", need=1, generates=True, computed=3)
    a, b = FakeJob("a", need=8, arrival=1.0), FakeJob("b", need=2, arrival=2.0)
    grants, owner, _ = plan(StepRules(100), [decode], [a, b], num_blocks=2)
    assert [grants, owner.log, names(owner.waiting)] == [[("d", 1)], [], ["a", "b"]]


def test_a_job_that_cannot_start_is_skipped() -> None:
    broken = FakeJob("broken", need=5, startable=False)
    fine = FakeJob("fine", need=5, arrival=1.0)
    grants, owner, _ = plan(StepRules(100), [], [broken, fine])
    assert [grants, owner.log, names(owner.running)] == [[("fine", 5)], ["fail broken"], ["fine"]]
