"""Engine API messages: Extend / Free / Lease and the stats an engine reports.

A context is the engine-side KV state of one token sequence. A context forked from a parent shares
the parent's KV blocks; the parent's tokens are the child's prefix.
"""

from __future__ import annotations

from collections.abc import Container, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from parrot.protocol.errors import ParrotError, conflict, not_found
from parrot.protocol.objective import Objective
from parrot.protocol.sampling import SamplingParams

ContextId = str
_ID = Field(min_length=1, max_length=128)
# The shared secret between a manager and the Parrot engine servers it uses: `parrot engine` and
# `parrot serve` read it from this environment variable (so it never shows in a process list).
ENGINE_SECRET_ENV = "PARROT_ENGINE_SECRET"
MAX_FILL_TOKENS = 1_000_000


class _Msg(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class _Req(_Msg):
    """A request body: types are strict (`true` is not 1, "5" is not 5), as the OpenAPI document says."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class TopLogprob(_Msg):
    token_id: int
    logprob: float


class ExtendRequest(_Req):
    """The engine's one operation: append `token_ids` to a context, then, with `sampling`, decode
    into the same context, streaming.

    The tokens go in first: without `append`, `context_id` is created (a fork sharing
    `parent_context_id`'s KV, if given, its tokens first); with `append`, the existing
    `context_id` is extended. Creating an id that exists is a 409 and appending to one that does
    not a 404, so a stale or repeated request never silently doubles a context (a restarted
    manager, a retried request). Then, with `sampling`, the generation runs in the same context.
    Everything is validated before anything is queued (400 / 404 / 409 naming the field); a fill
    that fails later ends the generation with its error. No tokens, no sampling and no parent is a
    400 (there is nothing to do; a fork without tokens is a fork); no tokens with sampling decodes
    from what the context holds (a new context without a parent then has nothing: a 400). An
    engine may compute the last token and sample the first output token in one step (the builtin
    engine does).

    The answer is a stream of TokenEvents (`TokenEvent.filled`): without `sampling`, exactly one,
    `finish_reason="filled"`; with it, the generation's events, the first carrying `filled` when
    tokens went in."""

    context_id: ContextId = _ID
    parent_context_id: ContextId | None = Field(default=None, min_length=1, max_length=128)
    append: bool = False
    # Checked before `token_ids` and `score`, whose rules depend on it (fields validate in order).
    sampling: SamplingParams | None = None
    token_ids: list[int] = Field(default_factory=list, max_length=MAX_FILL_TOKENS, validate_default=True)
    objective: Objective = Field(default=Objective.LATENCY, strict=False)
    priority: int = Field(default=0, ge=-1000, le=1000)
    # Without sampling: score the appended tokens: `Filled.token_logprobs` gives each one's
    # log-probability given every token before it (a select scores its options as forks of the
    # prompt this way). An engine that cannot score answers 400 naming `score`. `top_logprobs`
    # (with `score`): also each token's most likely alternatives at its position (`Filled.top_logprobs`).
    score: bool = False
    top_logprobs: int = Field(default=0, ge=0, le=20)
    # With sampling. False: nobody reads the text as it is generated (only the output at the end,
    # or another call that waits for it), so an engine may hand tokens over in batches (the OpenAI
    # adapter asks vLLM for chunks of 16: a token per chunk costs its server and the manager CPU).
    # Same tokens either way.
    watched: bool = True
    # With sampling. False: nobody reads the generated tokens' logprobs (`TokenEvent.logprob` may
    # then be None; `top_logprobs` are reported whatever it says), so the OpenAI adapter asks vLLM
    # for the token ids without logprobs (computing them cost vLLM ~3% per token). The builtin
    # engine computes them anyway.
    logprobs: bool = True

    @field_validator("token_ids")
    @classmethod
    def _something_to_do(cls, token_ids: list[int], info: ValidationInfo) -> list[int]:
        if token_ids or "sampling" not in info.data:  # (a refused `sampling` is reported itself)
            return token_ids
        if info.data["sampling"] is None and info.data.get("parent_context_id") is None:
            raise ValueError("an extend needs token_ids, sampling or a parent_context_id to fork: it has none")
        if not info.data.get("append") and info.data.get("parent_context_id") is None:
            raise ValueError("a new context without a parent needs token_ids: there is nothing to generate from")
        return token_ids

    @field_validator("score", "top_logprobs")
    @classmethod
    def _scores_only_a_fill(cls, value: bool | int, info: ValidationInfo) -> bool | int:
        if value and info.data.get("sampling") is not None:
            raise ValueError(
                "only for an extend without sampling: it scores the appended tokens "
                "(SamplingParams.top_logprobs reports a generation's alternatives)"
            )
        return value

    @field_validator("append")
    @classmethod
    def _append_has_no_parent(cls, append: bool, info: ValidationInfo) -> bool:
        if append and info.data.get("parent_context_id") is not None:
            raise ValueError("an append names no parent_context_id: the context has its tokens already")
        return append


class Filled(_Msg):
    """What the tokens of an Extend did (`TokenEvent.filled`)."""

    num_tokens: int  # the context's length after its tokens went in, parent prefix included
    num_filled_tokens: int  # tokens this extend computed before its generation (if any) took over
    # With `score`: one per appended token (None for a context's very first token: nothing precedes it).
    token_logprobs: list[float | None] | None = None
    top_logprobs: list[list[TopLogprob] | None] | None = None  # with score and top_logprobs, as token_logprobs


class TokenEvent(_Msg):
    """One streamed event of an Extend: a generated token, or the one result of an extend that
    does not generate. The last event has `finish_reason` set.

    `filled`: what the extend's tokens did; on its only event (`finish_reason="filled"`, no token)
    for an extend without sampling, on the first event of a generating extend that had tokens,
    else None.

    `text` is the new text this token completes (possibly empty while a multi-byte character is
    incomplete); on a stop-string finish, the stop string and what follows are not in any text.

    The context holds exactly the output's text: after a generation the context is its prompt
    followed by `output_token_ids` of the last event. They are the streamed token ids, except that
    an EOS is not appended and, on a stop-string finish, the tokens from the one where the stop
    string begins are cut and the text of that token before the stop is re-tokenized. None (an
    engine that does not say): the streamed token ids, an EOS excepted. Set on the last event only.

    `top_logprobs`: with `SamplingParams.top_logprobs` k > 0, the k most likely tokens at this
    step, most likely first (of the distribution `logprob` is taken from). `choice_logprobs`: with
    `SamplingParams.choices`, on the last event, each choice's log-probability where it is known
    (the chosen one's: the sum of its tokens' logprobs).
    """

    token_id: int | None
    logprob: float | None = None
    text: str = ""
    finish_reason: str | None = None  # "length" | "stop" | "eos" | "error" | "aborted" | "filled"
    error: str | None = None
    filled: Filled | None = None
    output_token_ids: list[int] | None = None
    top_logprobs: list[TopLogprob] | None = None
    choice_logprobs: dict[str, float] | None = None


class FreeContextRequest(_Req):
    context_id: ContextId = _ID


class LeaseRequest(_Req):
    """Hold the contexts whose ids start with one of `prefixes` for `ttl_s` more seconds. A holder
    (a manager run) renews its lease while it lives; once a lease runs out, the engine frees that
    lease's contexts as soon as no work is queued on them, so a dead manager's contexts come back.
    Contexts that no lease names are never reclaimed."""

    prefixes: list[str] = Field(min_length=1, max_length=16)
    ttl_s: float = Field(gt=0, le=86_400)

    @model_validator(mode="after")
    def _prefixes_are_specific(self) -> LeaseRequest:
        if any(not 4 <= len(p) <= 128 for p in self.prefixes):
            raise ValueError("each prefix must have 4..128 characters")
        return self


class ContextInfo(_Msg):
    context_id: ContextId
    parent_context_id: ContextId | None
    num_tokens: int
    num_blocks: int


class EngineStats(_Msg):
    """What an engine holds and how fast it runs; the manager's scheduler reads this."""

    model: str
    max_model_len: int
    block_size: int
    num_blocks_total: int
    num_blocks_free: int
    num_contexts: int
    num_running: int
    num_waiting: int
    recent_time_per_output_token_ms: float
    num_steps: int
    # Counters since start. Prefill: prompt tokens whose KV the engine computed (recomputation
    # after preemption included). Decode: tokens it generated. Reused: prompt tokens a context
    # took from elsewhere instead of computing them: a fork's share of its parent's computed
    # tokens (builtin engine), or the upstream's reported cached prompt tokens (OpenAI-compatible
    # adapter). Without preemption, a context's prompt tokens = its computed + its reused ones.
    num_prefill_tokens: int
    num_decode_tokens: int
    num_reused_tokens: int = 0
    num_preemptions: int = 0  # running generations sent back to waiting to free KV blocks
    num_interrupted_steps: int = 0  # steps stopped mid-pass for a higher-tier arrival (redone)
    # Capacity profile, measured online: recent step time (ms) by the step's batched tokens,
    # bucketed to powers of two (key = bucket's upper bound). The manager calibrates its
    # latency cap from it: the most tokens per step that keep time per output token on target.
    # An adapter of a server that shows no steps (OpenAI-compatible) reports the median gap
    # between a stream's tokens by the number of generations streaming at once (tpot_profile.py).
    step_ms_by_num_tokens: dict[int, float] = Field(default_factory=dict)
    # The builtin engine's native CPU kernels: the instruction sets they run on ("avx512_bf16",
    # "avx512_bf16+amx"), "off" (its config turned them off), or "unavailable: <reason>" (no C
    # compiler, a CPU without AVX512-BF16, a failed build, float32 weights). "none": an engine
    # without native kernels (adapters of other servers).
    native_kernels: str = "none"
    batch_invariant: bool = False  # outputs do not depend on the batch (EngineConfig.batch_invariant)


def check_token_ids(token_ids: Sequence[int], vocab: int, field: str = "token_ids") -> None:
    """Each of `token_ids` in [0, vocab): else a 400 naming `field` and the first one outside."""
    bad = next((t for t in token_ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise ParrotError(f"token id {bad} is outside the vocabulary [0, {vocab})", field=field)


def check_context_ids(contexts: Container[str], req: ExtendRequest) -> None:
    """The engine API's id rules for an Extend: an append names an existing context (404); a new
    context, a fork included, an id not held (409); a fork an existing parent (404). Raises
    ParrotError naming the field. Every engine applies them."""
    context_id, parent_id = req.context_id, req.parent_context_id
    exists = context_id in contexts
    if parent_id is not None:
        if exists:
            raise conflict(f"context {context_id!r} already exists; a fork needs a new id", "context_id")
        if parent_id not in contexts:
            raise not_found("parent context", parent_id, "parent_context_id")
    elif req.append and not exists:
        raise not_found("context", context_id, "context_id")
    elif not req.append and exists:
        raise conflict(f"context {context_id!r} already exists: name a new one, or append to it", "context_id")
