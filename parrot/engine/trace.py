"""The engine's optional step trace (`LLMEngine.start_trace` / `stop_trace`): one record a step."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepRecord:
    """One engine step, as `LLMEngine.start_trace` records it (profiling)."""

    started: float  # time.perf_counter() when the forward pass began
    elapsed_s: float  # the forward pass and sampling
    num_seqs: int
    num_decode: int  # rows that were one generated token each
    num_prefill_tokens: int  # every other row (prompt chunks, a fill's last token)
