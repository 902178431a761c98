"""A semantic call's run state: one record per call, beside the DAG node that holds its structure.

`CallRun` holds everything about a call that changes while it runs: its state, order and engine
placement, early-fill progress, timing, token usage, the objective deduced for it, its attempts and
the tokens each output streamed (so a re-run resumes), and the executor's bookkeeping for it (its
runner, its latest task, the engine load its run is counted in, its view for the policy).

Ownership and lifetime:
- Created by `GraphExecutor.add_calls` when the call is committed, and kept by its session
  (`Session.runs[call_id]`), where status and the OpenAI routes read it, until the session dies.
- Mutated on the manager's event loop only: by the executor (state, placement, timing, attempts,
  bookkeeping), by deduction.py (objective fields), by views.py (view, prefix points,
  ready_since) and by the call's runner (usage, finish reasons, output tokens).
- The executor indexes the record (`GraphExecutor._runs`) from its submission until the call has
  finished and its last task and engine slot are gone, or until its session is dropped.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from enum import StrEnum

from parrot.protocol.objective import Criteria, Objective
from parrot.serve.policy.plan import CallView
from parrot.serve.policy.prefix import PrefixPoint
from parrot.serve.runtime.call_runner import CallRunner
from parrot.serve.runtime.engines import EngineHandle
from parrot.serve.runtime.graph import CallNode
from parrot.serve.runtime.scoring import StreamedToken


class CallState(StrEnum):
    WAITING = "waiting"  # some input not set yet (its ready prefix may be filled already)
    RUNNING = "running"  # dispatched to an engine
    DONE = "done"
    FAILED = "failed"


FAIR_SHARE_PRIORITY = 2  # above every deduced priority (0, or 1: a person awaits it)


@dataclass(frozen=True, slots=True)
class EngineSlot:
    """A dispatched run, counted in its engine's load (running calls, latency calls) until that
    run's task ends; `runner` tells it from a later run of the same call."""

    engine: EngineHandle
    is_latency: bool
    runner: CallRunner


@dataclass(eq=False)
class CallRun:
    call: CallNode  # the structure (template, bindings, sampling); never changes
    order: int  # global submission order (the executor's)
    tenant: str = ""  # its session's tenant (fair share between tenants)
    state: CallState = CallState.WAITING
    engine_id: str | None = None  # the engine holding the call's context, once placed
    num_fill_requested: int = 0  # leading pieces the executor asked to fill early
    dispatched_at: float | None = None  # the manager clock when all inputs were ready and it ran
    finished_at: float | None = None
    first_token_at: float | None = None  # when its run's first output token arrived (metrics: TTFT)
    # Usage, written by the runner. Cached tokens: prompt tokens whose KV came from a cached prefix
    # context filled by other calls (the runner knows it from the fork; contexts.py).
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens reused from prefixes other calls computed
    num_early_filled_tokens: int = 0  # prompt tokens it computed early (before its inputs were all set)
    num_generated_tokens: int = 0
    prefix_source: str | None = None  # the kind of prefix point its cached tokens came from
    finish_reasons: dict[str, str] = field(default_factory=dict)  # output name -> the engine's reason
    # Deduced objective (policy/objectives.py via deduction.py; status shows it).
    objective: Objective = Objective.LATENCY
    urgency: Criteria | None = None
    task_group: str | None = None  # call id of the consumer its group feeds
    priority: int = 0
    fair_share: bool = False  # dispatched while its tenant ran under its share (plan.Dispatch)
    # Re-dispatch (an engine died): runs started, and each output's generated token ids so far
    # (complete or not), so a re-run resumes instead of losing or repeating text.
    num_attempts: int = 0
    output_token_ids: dict[str, list[int]] = field(default_factory=dict)
    # Every token each output streamed with its logprob, the EOS or stop string that ended it
    # included (output_token_ids are the context's: neither is there): what the OpenAI routes report.
    # With the sampling's `top_logprobs`, each token's alternatives too.
    output_tokens: dict[str, list[StreamedToken]] = field(default_factory=dict)
    # With the first output's `prompt_logprobs`: every prompt token, its logprob and alternatives.
    prompt_tokens: list[StreamedToken] | None = None
    # The executor's bookkeeping.
    runner: CallRunner | None = None  # from its first placement until retired (context freed)
    task: asyncio.Task[None] | None = None  # the latest of its tasks (they run one after another)
    slot: EngineSlot | None = None  # while its run is counted in an engine's load
    dirty: bool = True  # its view must be computed again at the next step
    # What the policy sees of it while waiting (views.py); reset when it leaves waiting.
    view: CallView | None = None
    prefix_points: tuple[PrefixPoint, ...] = ()  # of its ready prefix
    prefix_hashes: frozenset[str] = frozenset()  # theirs: a change to one of them refreshes its hits
    hits_stale: bool = False  # its view's prefix hits were not computed since its points were
    ready_since: float | None = None  # when all its inputs were first seen set
    ready_at: float | None = None  # ready_since when it last left waiting (metrics: queue time)

    @property
    def engine_priority(self) -> int:
        """The priority its engine requests carry: a tenant under its share of the engine (several
        tenants with work) ranks above the rest, then a call a person awaits (`priority` 1)."""
        return self.priority + FAIR_SHARE_PRIORITY * self.fair_share

    @property
    def is_settled(self) -> bool:
        """Finished, with no runner, task or engine slot left: the executor is done with it."""
        finished = self.state is CallState.DONE or self.state is CallState.FAILED
        return finished and self.runner is None and self.task is None and self.slot is None

    def leave_waiting(self) -> None:
        """Dispatched or failed: forget what the policy saw of it."""
        self.ready_at = self.ready_since if self.ready_since is not None else self.ready_at
        self.view, self.prefix_points, self.ready_since, self.dirty = None, (), None, False
        self.prefix_hashes, self.hits_stale = frozenset(), False

    def unplace(self) -> None:
        """Its early work is lost (runner retired): it may be placed anywhere again."""
        self.engine_id, self.num_fill_requested = None, 0
        self.dirty = True

    def requeue(self) -> None:
        """Its run was lost with its engine (runner retired, slot released): waiting again, with
        its attempts, outputs and generated tokens kept so that the next run resumes."""
        self.state = CallState.WAITING
        self.dispatched_at = self.first_token_at = None
        self.num_prompt_tokens = self.num_cached_tokens = self.num_early_filled_tokens = 0
        self.unplace()
