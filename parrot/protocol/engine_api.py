"""Engine API messages: Fill / Generate / FreeContext and the stats an engine reports.

A context is the engine-side KV state of one token sequence. A context forked from a parent shares
the parent's KV blocks; the parent's tokens are the child's prefix.
"""

from __future__ import annotations

from collections.abc import Container, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

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


class FillRequest(_Req):
    """Create `context_id` holding `token_ids` (a fork of `parent_context_id`'s tokens first, if
    given), or with `append` extend the existing `context_id`. Creating an id that exists is a 409
    and appending to one that does not a 404, so a stale or repeated request never silently
    doubles a context (a restarted manager, a retried request)."""

    context_id: ContextId = _ID
    token_ids: list[int] = Field(max_length=MAX_FILL_TOKENS)
    parent_context_id: ContextId | None = Field(default=None, min_length=1, max_length=128)
    append: bool = False

    @model_validator(mode="after")
    def _append_has_no_parent(self) -> FillRequest:
        if self.append and self.parent_context_id is not None:
            raise ValueError("an append names no parent_context_id: the context has its tokens already")
        return self

    objective: Objective = Field(default=Objective.LATENCY, strict=False)
    priority: int = Field(default=0, ge=-1000, le=1000)
    # Score the filled tokens: FillResult.token_logprobs gives each one's log-probability given
    # every token before it (a select scores its options as forks of the prompt this way). An
    # engine that cannot score answers 400 naming `score`. `top_logprobs` (with `score`): also each
    # filled token's most likely alternatives at its position (FillResult.top_logprobs).
    score: bool = False
    top_logprobs: int = Field(default=0, ge=0, le=20)


class FillResult(_Msg):
    context_id: ContextId
    num_tokens: int  # the context's length after the fill, parent prefix included
    num_filled_tokens: int  # tokens this fill computed
    # With `score`: one per filled token (None for a context's very first token: nothing precedes it).
    token_logprobs: list[float | None] | None = None
    top_logprobs: list[list[TopLogprob] | None] | None = None  # with score and top_logprobs, as token_logprobs


class GenerateRequest(_Req):
    """Decode into `context_id` (created as a fork of `parent_context_id` if given).

    With `token_ids`, one request fills then generates: first `token_ids` go into `context_id`
    exactly as FillRequest(context_id, token_ids, parent_context_id, append, objective, priority)
    would put them (create, fork from the parent, or with `append` extend), then the generation
    runs. The fill part is validated at once as a Fill is (404 / 409 / 400), before anything is
    queued; a fill that fails later ends the generation with its error. An engine may run the
    fill's last token and the first sample in one step (the builtin engine does)."""

    context_id: ContextId = _ID
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    parent_context_id: ContextId | None = Field(default=None, min_length=1, max_length=128)
    token_ids: list[int] = Field(default_factory=list, max_length=MAX_FILL_TOKENS)
    append: bool = False
    objective: Objective = Field(default=Objective.LATENCY, strict=False)
    priority: int = Field(default=0, ge=-1000, le=1000)
    # False: nobody reads the text as it is generated (only the output at the end, or another call
    # that waits for it), so an engine may hand tokens over in batches (the OpenAI adapter asks vLLM
    # for chunks of 16: a token per chunk costs its server and the manager CPU). Same tokens either way.
    watched: bool = True
    # False: nobody reads the generated tokens' logprobs (`TokenEvent.logprob` may then be None;
    # `top_logprobs` are reported whatever it says), so the OpenAI adapter asks vLLM for the token
    # ids without logprobs (computing them cost vLLM ~3% per token). The builtin engine computes them anyway.
    logprobs: bool = True

    @model_validator(mode="after")
    def _append_has_no_parent(self) -> GenerateRequest:
        if self.append and self.parent_context_id is not None:
            raise ValueError("an append names no parent_context_id: the context has its tokens already")
        return self

    def fill_part(self) -> FillRequest | None:
        """The Fill this request begins with; None without token_ids (a plain Generate)."""
        if not self.token_ids:
            return None
        return FillRequest(
            context_id=self.context_id,
            token_ids=self.token_ids,
            parent_context_id=self.parent_context_id,
            append=self.append,
            objective=self.objective,
            priority=self.priority,
        )

    def generate_part(self) -> GenerateRequest:
        """The Generate that follows the fill part (the context exists by then)."""
        if not self.token_ids:
            return self
        return self.model_copy(update={"token_ids": [], "parent_context_id": None, "append": False})


class TokenEvent(_Msg):
    """One streamed step of a generation. The last event has `finish_reason` set.

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
    finish_reason: str | None = None  # "length" | "stop" | "eos" | "error" | "aborted"
    error: str | None = None
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


def check_context_ids(
    contexts: Container[str], context_id: str, parent_id: str | None, must_exist: bool, must_be_new: bool = False
) -> None:
    """The engine API's id rules for a Fill (creating: `must_be_new`; appending: `must_exist`) or a
    Generate (`must_exist`): a fork names a new id and an existing parent other than itself; an
    append names an existing context and no parent. Raises ParrotError (400 / 404 / 409) naming
    the field. Every engine applies them."""
    exists = context_id in contexts
    if parent_id is None and must_exist and not exists:
        raise not_found("context", context_id, "context_id")
    if must_be_new and exists:
        raise conflict(f"context {context_id!r} already exists: name a new one, or append to it", "context_id")
    if parent_id is not None:
        if exists:
            raise conflict(f"context {context_id!r} already exists; a fork needs a new id", "context_id")
        if parent_id not in contexts:
            raise not_found("parent context", parent_id, "parent_context_id")
        if parent_id == context_id:
            raise ParrotError("a context cannot be its own parent", field="parent_context_id")
