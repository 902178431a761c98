"""Step planning: which jobs compute how many tokens in the next step, and whose KV makes room.

The rules of a step, shared by the builtin engine's `Scheduler` (sched/scheduler.py) and the
simulator's (parrot/sim/scheduler.py), which differ only in their jobs, their KV and their clock:

- a token budget (`token_budget`): `max_num_batched_tokens`; `latency_max_batched_tokens` while
  latency-critical work decodes; at least `latency_prefill_tokens` while it only prefills; at most
  `latency_prefill_tokens` in the contention window after tiers met;
- decode rows first (a job with at most one token to compute), then prompt chunks, both in order of
  the policy's keys (policy.py); a waiting job that outranks a running chunk starts before it;
- tiers: jobs of a lower tier than the best share `outranked_chunk_tokens` prompt tokens a step,
  beside their one-token decodes (`Plan.limited` says the share held one back: the caller starts
  its contention window);
- in a step without decodes a prompt whose rest exceeds the budget by at most budget /
  `remainder_share` takes it all (`remainder_slack`), within `max_num_batched_tokens`;
- KV: a job whose blocks do not fit reclaims idle contexts (the owner's order), then the contexts
  of waiting jobs (lowest ranked first), then, a running job only, preempts the running jobs
  ranked below it (lowest first); a job that fits nowhere with nothing else planned is rejected.

Pure: no torch, no clock, no I/O, no state between calls. The caller owns the jobs, their contexts
and the blocks, and answers through `Owner`; `plan_step` moves jobs between the caller's `running`
and `waiting` lists as it admits and preempts, and returns the grants.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from parrot.engine.sched.policy import tier
from parrot.protocol.objective import Objective

# After a better tier met a lower one (an interrupted step, a lower-tier prompt held back), steps
# stay prefill-sized this long: more such requests tend to follow the first.
CONTENTION_S = 2.0
# In a step without decodes, a prompt whose rest exceeds the budget by at most budget / this is
# computed whole (`remainder_slack`), within max_num_batched_tokens.
REMAINDER_SHARE = 8


class PlannedJob(Protocol):
    """What the planner reads of a job itself (the rest it asks its `Owner`)."""

    @property
    def context_id(self) -> str: ...

    @property
    def objective(self) -> Objective: ...


J = TypeVar("J", bound=PlannedJob)


class Owner(Protocol[J]):
    """The scheduler that owns the jobs, their contexts and the KV blocks, as the planner sees it.

    `reserve`, `reclaim_idle`, `truncate` and `preempt` change the owner's KV at once; `start`
    and `reject` may end a job (the owner then removes it from `running` / `waiting`)."""

    def ready(self, job: J) -> bool:
        """Not behind an earlier job on its context, nor behind the jobs of the parent it forks."""
        ...

    def need(self, job: J) -> int:
        """Tokens the job computes before it samples or ends."""
        ...

    def decoding(self, job: J) -> bool:
        """A ready generation with at most one token to compute: each step makes one of its tokens."""
        ...

    def start(self, job: J) -> bool:
        """Make a waiting job computable (first admission: fork its parent, take its tokens); False:
        it can never run, and the owner ended it with an error."""
        ...

    def handoff(self, job: J, num_new: int) -> J | None:
        """The job that samples after `job`'s last chunk, when `num_new` tokens finish `job` and the
        chunk may take one more token for it (the builtin engine's fill before its generation)."""
        ...

    def reserve(self, job: J, num_new: int) -> bool:
        """Blocks for `num_new` more tokens of `job`; False (nothing changed) when they are short."""
        ...

    def reclaim_idle(self, keep: set[str]) -> bool:
        """Free the KV of one context no job uses and not in `keep`; False when none frees a block."""
        ...

    def truncate(self, job: J) -> bool:
        """Free the KV of a waiting job's context that no other context shares; False: none freed."""
        ...

    def preempt(self, job: J) -> None:
        """Free a running job's KV that no other context shares; it recomputes it when it runs again."""
        ...

    def reject(self, job: J) -> None:
        """End a job whose blocks fit nowhere, with an error."""
        ...


@dataclass(frozen=True)
class StepRules:
    """The numbers that bound a step (the builtin engine's EngineConfig; a simulated setup's)."""

    max_num_batched_tokens: int
    latency_max_batched_tokens: int | None = None  # None: no cap while latency work decodes
    latency_prefill_tokens: int | None = None  # None: the cap holds for prefill-only steps too
    outranked_chunk_tokens: int | None = None  # None: lower tiers are not limited
    max_num_seqs: int | None = None  # jobs a step; None: no limit
    remainder_share: int | None = REMAINDER_SHARE  # None: a prompt's last chunk never runs over


@dataclass(frozen=True)
class Grant(Generic[J]):
    """One job's share of a step: compute `num_new` tokens; with `handoff`, one more, sampled for it."""

    job: J
    num_new: int
    handoff: J | None = None


@dataclass
class Plan(Generic[J]):
    grants: list[Grant[J]] = field(default_factory=list)  # decode rows first, then prompt chunks
    limited: bool = False  # a lower-tier job got fewer prompt tokens than it needed


def token_budget(rules: StepRules, latency_work: bool, latency_decodes: bool, contended: bool) -> int:
    """The step's tokens. Latency-critical work that decodes caps them (every step is one of its
    output tokens); latency-critical work that only prefills gets prefill-sized steps. In the
    contention window (`contended`), steps are prefill-sized too: a better-tier request that arrives
    mid-step then interrupts a layer of a 512-token step, not of a 2,048-token one."""
    full = rules.max_num_batched_tokens
    if contended and rules.latency_prefill_tokens is not None:
        full = min(full, rules.latency_prefill_tokens)
    cap = rules.latency_max_batched_tokens
    if cap is None or not latency_work:
        return full
    if rules.latency_prefill_tokens is not None and not latency_decodes:
        cap = max(cap, rules.latency_prefill_tokens)
    return min(cap, full)


def remainder_slack(rules: StepRules, budget: int) -> int:
    """Tokens a prompt's last chunk may take beyond `budget` in a step without decodes: a 1,056-token
    prompt in 512-token steps is 544 + 512 tokens, not 512 + 512 + 32, whose third step costs ~65 ms
    for 32 tokens on two cores (the weights are read once per step whatever its size); with a decode
    in the step, none (its time per output token stays capped)."""
    if rules.remainder_share is None:
        return 0
    return max(0, min(budget // rules.remainder_share, rules.max_num_batched_tokens - budget))


@dataclass
class Budget:
    """One step's tokens. Jobs of a lower tier than the step's best (`top`) share at most
    `outranked_left` of them (None: no such limit), beyond one decode token each: someone's output
    is not slowed by prompts that matter less."""

    tokens: int
    outranked_left: int | None
    top: tuple | None
    limited: bool = False  # some lower-tier job got fewer prompt tokens than it needed
    slack: int = 0  # tokens a prompt's last chunk may take beyond `tokens` (remainder_slack)

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


def plan_step(
    owner: Owner[J],
    running: list[J],
    waiting: list[J],
    rules: StepRules,
    key: Callable[[J], tuple],
    contended: bool = False,
) -> Plan[J]:
    """Plan one step over `running` (started: they hold blocks) and `waiting` jobs, ranked by `key`
    (policy.py: smaller first); `contended`: in the contention window (CONTENTION_S after a plan
    was `limited`, or after an interrupted step). Sorts both lists; admitted jobs move to `running`,
    preempted ones to `waiting`."""
    return _Planner(owner, running, waiting, rules, key).plan(contended)


class _Planner(Generic[J]):
    """One call of `plan_step`: its lists, budget and the contexts already in the plan."""

    def __init__(
        self, owner: Owner[J], running: list[J], waiting: list[J], rules: StepRules, key: Callable[[J], tuple]
    ) -> None:
        self.owner = owner
        self.running = running
        self.waiting = waiting
        self.rules = rules
        self.key = key
        self.out: Plan[J] = Plan()
        self.protected: set[str] = set()  # contexts of planned jobs: never reclaimed in this step
        self.budget = Budget(0, None, None)

    def plan(self, contended: bool) -> Plan[J]:
        owner, rules = self.owner, self.rules
        self.running.sort(key=self.key)
        self.waiting.sort(key=self.key)
        latency = [j for j in self.running + self.waiting if j.objective == Objective.LATENCY]
        decodes_latency = any(owner.decoding(j) for j in latency)
        tokens = token_budget(rules, bool(latency), decodes_latency, contended)
        self.budget = Budget(tokens, rules.outranked_chunk_tokens, self._top_tier())
        # Decodes first (one token each), then chunks, both in policy order. A waiting job that
        # outranks a running chunk starts before it: a long prefill of lower-ranked work does not
        # hold back a higher-ranked request that arrives while it runs.
        decodes: list[J] = []
        chunks: list[J] = []
        for job in self.running:
            (decodes if owner.need(job) <= 1 else chunks).append(job)
        self._serve(decodes)
        if not decodes and not any(owner.decoding(j) for j in self.waiting):
            self.budget.slack = remainder_slack(rules, self.budget.tokens)
        for job in chunks:
            self._admit(above=self.key(job))
            self._serve([job])
        self._admit()
        self.out.limited = self.budget.limited
        return self.out

    def _top_tier(self) -> tuple | None:
        """The best tier among running jobs and ready waiting ones, or None."""
        jobs = itertools.chain(self.running, (j for j in self.waiting if self.owner.ready(j)))
        return min((tier(self.key(j)) for j in jobs), default=None)

    def _full(self) -> bool:
        limit = self.rules.max_num_seqs
        return self.budget.tokens <= 0 or (limit is not None and len(self.out.grants) >= limit)

    def _serve(self, jobs: list[J]) -> None:
        """Give running `jobs` their tokens of the step, in order."""
        budget = self.budget
        for job in jobs:
            if job not in self.running or self._full():
                continue
            outranked = budget.outranked(self.key(job))
            need = self.owner.need(job)
            n = budget.grant(need, outranked)
            if need and not n:
                continue  # lower-tier prompt with the outranked share spent
            handoff = self.owner.handoff(job, n) if n < budget.room(outranked) else None
            if not self._reserve(job, n + (handoff is not None), may_preempt=True):
                continue
            self._grant(job, n, handoff, outranked)

    def _admit(self, above: tuple | None = None) -> None:
        """Start waiting jobs (sorted) that are ready, in order, while the budget lasts; with
        `above`, only those ranked before that key."""
        budget = self.budget
        keys = ((j, self.key(j)) for j in self.waiting)
        # Only the (usually short) head ranked before `above` is copied, not the whole queue.
        candidates = list(itertools.takewhile(lambda jk: above is None or jk[1] < above, keys))
        for job, key in candidates:
            if self._full():
                return
            if job not in self.waiting or not self.owner.ready(job) or not self.owner.start(job):
                continue
            outranked = budget.outranked(key)
            need = self.owner.need(job)
            n = budget.grant(need, outranked)
            if need and not n:
                continue  # lower-tier prompt with the outranked share spent: it stays waiting
            handoff = self.owner.handoff(job, n) if 0 < n < budget.room(outranked) else None
            if n and not self._reserve(job, n + (handoff is not None), may_preempt=False):
                return  # wait for running work to free blocks; keep the order
            self.waiting.remove(job)
            self.running.append(job)
            self._grant(job, n, handoff, outranked)  # n == 0: nothing to compute, done this step

    def _grant(self, job: J, n: int, handoff: J | None, outranked: bool) -> None:
        self.out.grants.append(Grant(job, n, handoff))
        self.protected.add(job.context_id)
        self.budget.spend(n + (handoff is not None), outranked)

    def _reserve(self, job: J, n: int, may_preempt: bool) -> bool:
        """Reserve blocks for `n` more tokens of `job`, reclaiming others' blocks if needed; a job
        that cannot fit even then, with nothing else planned, is rejected."""
        keep = self.protected | {job.context_id}
        while True:
            if self.owner.reserve(job, n):
                return True
            if self._reclaim(keep, job if may_preempt else None):
                continue
            if not self.out.grants and (may_preempt or not self.running):
                self.owner.reject(job)
            return False

    def _reclaim(self, keep: set[str], preempt_below: J | None) -> bool:
        """Free some blocks: an idle context, then a waiting job's context (lowest ranked first),
        then, with `preempt_below`, the lowest-ranked running job ranked below it."""
        if self.owner.reclaim_idle(keep):
            return True
        for j in reversed(self.waiting):
            if j.context_id not in keep and self.owner.truncate(j):
                return True
        if preempt_below is not None:
            for j in reversed(self.running):
                if j is preempt_below:
                    break
                if j.context_id not in keep:
                    self.owner.preempt(j)
                    self.running.remove(j)
                    self.waiting.append(j)
                    return True
        return False
