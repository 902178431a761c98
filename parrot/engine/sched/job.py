"""A job: one part of an Extend request in the engine (its fill: the tokens going in; or its
generation), with its progress and its event sink. An Extend with tokens and sampling is a fill
job followed on its context by a generation job (`Job.then`)."""

from __future__ import annotations

import enum
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from parrot.engine.sampler import SampleRow
from parrot.protocol.engine_api import Filled, TokenEvent, TopLogprob
from parrot.protocol.errors import ParrotError
from parrot.protocol.objective import Objective
from parrot.protocol.sampling import SamplingParams
from parrot.text.tokenizer import IncrementalDecoder

# What a sink receives: token events (of a generation, or the one `filled` event of an extend that
# does not generate) or an error. The last item of every job is a TokenEvent with finish_reason or
# a ParrotError; a fill followed by its extend's generation ends with nothing of its own: its
# `Filled` rides on the generation's first event.
JobEvent = TokenEvent | ParrotError
Sink = Callable[[JobEvent], None]
# One step's events, handed to the callers in one call (`LLMEngine.hand_off`), each with its sink.
StepEvents = list[tuple[Sink, JobEvent]]


class JobKind(enum.Enum):
    FILL = "fill"
    GENERATE = "generate"


@dataclass(eq=False)
class Job:
    job_id: int
    kind: JobKind
    context_id: str
    sink: Sink
    objective: Objective
    priority: int
    arrival: float
    fork_from: str | None = None  # parent to fork from when the job starts (new context)
    token_ids: list[int] = field(default_factory=list)  # fill tokens
    sampling: SamplingParams | None = None
    # progress
    started: bool = False
    target: int = 0  # fill: compute up to this many tokens
    num_filled: int = 0
    num_generated: int = 0
    sample_row: SampleRow | None = None
    decoder: IncrementalDecoder | None = None
    stop_window: str = ""  # recent text kept to catch stop strings across token boundaries
    output_token_ids: list[int] = field(default_factory=list)  # what this generation put in the context
    # A scoring fill (ExtendRequest.score): each filled token's logprob, NaN until computed, and the
    # index in the context's tokens of its first filled token.
    scores: list[float] | None = None
    score_from: int = 0
    score_tops: list[list[TopLogprob] | None] | None = None  # with ExtendRequest.top_logprobs: alternatives
    num_score_top: int = 0
    finished: bool = False
    # A fill: the generation of the same Extend, queued right behind it; it reports the fill.
    then: Job | None = None
    # A generation: its extend's fill ended; the next event it emits carries this.
    filled: Filled | None = None

    def fill_result(self, num_tokens: int) -> Filled:
        """What a fill that ended reports (a scoring fill: its tokens' logprobs, None where unknown)."""
        scored = None if self.scores is None else [None if math.isnan(x) else x for x in self.scores]
        return Filled(
            num_tokens=num_tokens,
            num_filled_tokens=self.num_filled,
            token_logprobs=scored,
            top_logprobs=self.score_tops,
        )

    def emit(self, event: JobEvent) -> None:
        """Hand one event to the sink at once (errors, aborts: outside a step's batch)."""
        deliver([(self.sink, event)])


def deliver(events: StepEvents) -> None:
    """The plain hand-off: each event to its sink, in order, in the calling thread."""
    for sink, event in events:
        try:
            sink(event)
        except Exception:  # a broken listener must never take the engine loop down
            logging.getLogger(__name__).exception("event sink failed")


@dataclass(frozen=True)
class ScheduledSeq:
    """One job's share of a step: compute `num_new` tokens; sample after them if `sample`.

    A fill's last chunk may also compute the context's final token and sample the first token of
    the generation queued right behind it (`sample_for`), which then needs no step of its own.
    """

    job: Job
    num_new: int
    sample: bool
    sample_for: Job | None = None

    @property
    def sampler_job(self) -> Job:
        return self.sample_for or self.job


@dataclass
class StepPlan:
    """What the scheduler decided for one step; the engine applies it."""

    seqs: list[ScheduledSeq] = field(default_factory=list)  # decodes first, then prefill chunks
    block_copies: list = field(default_factory=list)  # copy-on-write copies to make before the step
    failed: list[tuple[Job, ParrotError]] = field(default_factory=list)  # jobs that can never fit
