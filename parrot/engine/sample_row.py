"""`SampleRow`: one generation's sampling state (settings, generator, adjustment state)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from parrot.protocol.engine_api import TopLogprob
from parrot.protocol.sampling import SamplingParams


@dataclass(eq=False)
class SampleRow:
    """One generation's sampling state, owned by its job; touched by the engine loop only."""

    params: SamplingParams
    generator: torch.Generator | None  # per request; None for greedy
    matcher: Any = None  # the grammar's matcher (constraints.py), when the output is constrained
    counts: torch.Tensor | None = None  # [V] float32: output token counts (presence/frequency)
    seen: torch.Tensor | None = None  # [V] bool: prompt and output tokens (repetition penalty)
    bias_ids: torch.Tensor | None = None  # logit_bias as tensors, built on first use
    bias_values: torch.Tensor | None = None
    top: list[TopLogprob] | None = None  # the latest token's alternatives (params.top_logprobs)
    logprob_sum: float = 0.0  # of the tokens chosen so far (a choice's score)

    @property
    def adjusts(self) -> bool:
        return self.matcher is not None or self.params.penalized

    @property
    def needs_history(self) -> bool:
        """The repetition penalty needs the prompt's tokens before the first sample."""
        return self.params.repetition_penalty != 1.0 and self.seen is None
