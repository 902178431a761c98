"""Sampling settings of one generation, validated once at the edge."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

MAX_STOP_STRINGS = 16
MAX_STOP_STRING_LEN = 256
MAX_TOP_LOGPROBS = 20  # alternatives reported per token (OpenAI's limit)
MAX_LOGIT_BIAS = 1024  # tokens one request may bias
MAX_JSON_SCHEMA_CHARS = 65536  # a JSON schema's size, serialized
MAX_CHOICE_LEN = 1024  # characters of one of `choices`


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
    # With `choices`: the manager picks the choice the model finds most likely (the highest sum of
    # its tokens' logprobs), scoring each as a fork of the filled prompt: one fill plus one short
    # scoring fill per choice, no generation. The scores come with the value. Without it, the text
    # is generated under the choices grammar (the first likely path, as vLLM's guided choice does).
    score_choices: bool = False
    # Each generated token's `top_logprobs` most likely alternatives are reported with it.
    top_logprobs: int = Field(default=0, ge=0, le=MAX_TOP_LOGPROBS)
    # vLLM's: the prompt's tokens are reported too, each with its logprob given the tokens before it
    # and this many alternatives (the completions API's `echo` with `logprobs`). Set on a call's
    # first output, the manager fills that call's whole prompt as one scoring fill (ExtendRequest.score,
    # no cached prefix: every prompt token is computed); engines themselves ignore it.
    prompt_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    # OpenAI's penalties on the output so far: logit -= presence * [count > 0] + frequency * count.
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    # vLLM's (CTRL's): a positive logit of a token in the prompt or output is divided by it, a
    # negative one multiplied; 1 disables it.
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=10.0)
    logit_bias: dict[int, float] = Field(default_factory=dict, max_length=MAX_LOGIT_BIAS)

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

    @field_validator("logit_bias")
    @classmethod
    def _check_bias(cls, bias: dict[int, float]) -> dict[int, float]:
        for token_id, value in bias.items():
            if token_id < 0:
                raise ValueError("logit_bias: token ids must be >= 0")
            if not -100.0 <= value <= 100.0:
                raise ValueError(f"logit_bias: each bias must be within [-100, 100] (token {token_id}: {value})")
        return bias

    @field_validator("choices")
    @classmethod
    def _check_choices(cls, choices: list[str] | None) -> list[str] | None:
        if choices is not None and any(not c or len(c) > MAX_CHOICE_LEN for c in choices):
            raise ValueError(f"choices: each choice must have 1..{MAX_CHOICE_LEN} characters")
        return choices

    @field_validator("json_schema")
    @classmethod
    def _check_schema_size(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        if schema is not None and len(json.dumps(schema)) > MAX_JSON_SCHEMA_CHARS:
            raise ValueError(f"json_schema: at most {MAX_JSON_SCHEMA_CHARS} characters serialized")
        return schema

    @model_validator(mode="after")
    def _one_constraint(self) -> SamplingParams:
        named = [n for n in ("regex", "json_schema", "choices") if getattr(self, n) is not None]
        if len(named) > 1:
            raise ValueError(f"at most one of regex, json_schema and choices (got {', '.join(named)})")
        if self.score_choices and self.choices is None:
            raise ValueError("score_choices scores the choices: set choices")
        if named and self.ignore_eos:
            raise ValueError(f"{named[0]} ends the output where the constraint is met: ignore_eos cannot be set")
        return self

    @property
    def constrained(self) -> bool:
        return self.regex is not None or self.json_schema is not None or self.choices is not None

    @property
    def penalized(self) -> bool:
        """Some logit adjustment depends on the tokens so far (or on a fixed bias)."""
        return bool(
            self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0 or self.logit_bias
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
