"""The engine's step counters, timing averages and optional step trace (`LLMEngine.start_trace`)."""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from parrot.engine.sched.job import ScheduledSeq


@dataclass(frozen=True)
class StepRecord:
    """One engine step, as `LLMEngine.start_trace` records it (profiling)."""

    started: float  # time.perf_counter() when the forward pass began
    elapsed_s: float  # the forward pass and sampling
    num_seqs: int
    num_decode: int  # rows that were one generated token each
    num_prefill_tokens: int  # every other row (prompt chunks, a fill's last token)
    step_s: float = 0.0  # the whole step in the loop thread: scheduling to the events' hand-off
    num_kv_tokens: int = 0  # the step's sequences' lengths after it, summed (keys attended)


class StepMeter:
    """What `LLMEngine.stats` reports about steps, and the trace while one is on. Counted by the
    loop thread with the engine lock held; a trace record is appended after the step's hand-off."""

    def __init__(self) -> None:
        self.num_steps = self.num_prefill_tokens = self.num_decode_tokens = 0
        self.tpot_ms = 0.0  # EMA of decoding steps' forward time: time per output token
        self.step_ms: dict[int, float] = {}  # capacity profile: tokens bucket -> EMA of step ms
        self.trace: collections.deque[StepRecord] | None = None

    def count(self, num_tokens: int, num_sampled: int, elapsed_s: float, decoding: bool) -> None:
        """One step's forward pass: `num_tokens` rows, `num_sampled` tokens sampled; `decoding`
        when some generation took its next token (a fill's hand-over alone is a first token)."""
        self.num_steps += 1
        self.num_decode_tokens += num_sampled
        ms = elapsed_s * 1000.0
        if num_tokens:
            bucket = 1 << (num_tokens - 1).bit_length()
            old = self.step_ms.get(bucket)
            self.step_ms[bucket] = ms if old is None else 0.8 * old + 0.2 * ms
        if decoding:
            self.tpot_ms = ms if self.tpot_ms == 0 else 0.8 * self.tpot_ms + 0.2 * ms

    def start_trace(self, max_steps: int) -> bool:
        if self.trace is not None:
            return False
        self.trace = collections.deque(maxlen=max_steps)
        return True

    def stop_trace(self, keep: bool) -> list[StepRecord]:
        trace = list(self.trace or ())
        if not keep:
            self.trace = None
        return trace

    def record(self, seqs: list[ScheduledSeq], started: float, elapsed_s: float, planned: float, kv: int) -> None:
        """Append the step that ran `seqs` to the trace, if one is on (`planned`: when its
        scheduling began, time.perf_counter(); `kv`: its sequences' lengths after it, summed)."""
        if self.trace is None:
            return
        ones = sum(1 for s in seqs if s.num_new == 1 and s.sample and s.sample_for is None)
        num_tokens = sum(s.num_new for s in seqs)
        step_s = time.perf_counter() - planned
        self.trace.append(StepRecord(started, elapsed_s, len(seqs), ones, num_tokens - ones, step_s, kv))
