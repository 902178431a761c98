"""Sampling settings of one generation, validated once at the edge."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_STOP_STRINGS = 16
MAX_STOP_STRING_LEN = 256


class SamplingParams(BaseModel):
    """How to pick tokens and when to stop.

    temperature 0 means greedy; `seed` makes a sampled generation reproducible whatever it is
    batched with. Generation stops at `max_tokens`, at any of `stop` (strings, excluded from the
    output) or `stop_token_ids` (included), or at the model's EOS unless `ignore_eos`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)  # a request: `true` is not 1

    max_tokens: int = Field(default=64, ge=1, le=32768)
    temperature: float = Field(default=0.0, ge=0.0, le=100.0)
    top_k: int = Field(default=0, ge=0, le=1_000_000, description="0 disables top-k")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    stop: list[str] = Field(default_factory=list, max_length=MAX_STOP_STRINGS)
    stop_token_ids: list[int] = Field(default_factory=list, max_length=64)
    ignore_eos: bool = False
    # Constrained output (at most one): the text matches `regex`, parses as JSON valid against
    # `json_schema`, or is exactly one of `choices`.
    regex: str | None = Field(default=None, min_length=1, max_length=4096)
    json_schema: dict[str, Any] | None = None
    choices: list[str] | None = Field(default=None, min_length=1, max_length=64)

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, stop: list[str]) -> list[str]:
        for s in stop:
            if not s or len(s) > MAX_STOP_STRING_LEN:
                raise ValueError(f"each stop string must have 1..{MAX_STOP_STRING_LEN} characters")
        return stop

    @field_validator("stop_token_ids")
    @classmethod
    def _check_stop_ids(cls, ids: list[int]) -> list[int]:
        if any(t < 0 for t in ids):
            raise ValueError("token ids must be >= 0")
        return ids

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
