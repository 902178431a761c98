"""Public HTTP API messages: sessions, semantic calls and Semantic Variables.

The manager's FastAPI routes take and return exactly these models, so they are also the published
OpenAPI schema; the client SDK builds them. Limits live here as constants so that the server's 4xx
messages and the SDK agree on them.

Authentication: `POST /v1/sessions` carries the tenant's API key (`Authorization: Bearer <key>`)
and returns a session token; every other session route carries that token the same way.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from parrot.protocol.objective import Criteria, Objective
from parrot.protocol.sampling import SamplingParams

# Any variable id; a client-chosen one has no `~` (the manager's own ids do, so they never collide).
ID_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.:~\-]{0,127}$"
CLIENT_ID_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.:\-]{0,63}$"
MAX_TEMPLATE_CHARS = 1_000_000
MAX_VALUE_CHARS = 4_000_000
MAX_NAME_CHARS = 128
MAX_BATCH_CALLS = 4096
MAX_BATCH_VARIABLES = 8192
MAX_BINDINGS = 256
MAX_MESSAGES = 256
MAX_GET_TIMEOUT_S = 600.0


class _Msg(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class _Req(_Msg):
    """A request body: types are strict (`true` is not 1, "5" is not 5), as the OpenAPI document says."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


class ErrorBody(_Msg):
    message: str
    field: str | None = None
    status: int
    # What OpenAI clients read: "invalid_request_error" (4xx) or "server_error" (5xx), and the field.
    type: str | None = None
    param: str | None = None


class ErrorResponse(_Msg):
    """The body of every 4xx/5xx answer (see ParrotError.to_dict)."""

    error: ErrorBody


# --- sessions ---------------------------------------------------------------------------------


class CallStatus(_Msg):
    """One call of a session as the manager sees it, with its deduced performance objective."""

    call_id: str
    name: str | None
    state: str  # waiting | running | done | failed
    objective: Objective  # deduced from the gets downstream (latency or throughput)
    urgency: Criteria | None  # the strongest criteria waiting on it (None: nobody asked yet)
    task_group: str | None  # call id of the consumer its task group feeds
    priority: int
    engine_id: str | None
    num_attempts: int  # re-dispatches after an engine died
    num_prompt_tokens: int
    # Of its prompt tokens: reused from cached prefixes other calls computed (what OpenAI usage
    # reports as cached), and computed by an engine for this call (the rest), of which
    # `num_early_filled_tokens` before its last input was set (pipelining).
    num_cached_tokens: int
    num_computed_tokens: int = 0
    num_early_filled_tokens: int = 0
    num_generated_tokens: int


class EngineUsage(_Msg):
    """What a session's calls cost one engine: prompt tokens it computed for them and reused from
    other calls' prefixes, and tokens it generated."""

    engine_id: str
    num_computed_tokens: int
    num_cached_tokens: int
    num_generated_tokens: int


class SessionStatus(_Msg):
    session_id: str
    num_variables: int
    num_calls: int
    num_calls_waiting: int  # not all inputs ready yet (possibly prefilled already)
    num_calls_running: int
    num_calls_done: int
    num_calls_failed: int
    idle_timeout_s: float
    idle_s: float
    calls: list[CallStatus] = Field(default_factory=list)
    engines: list[EngineUsage] = Field(default_factory=list)  # by engine its calls ran on


class SessionSummary(_Msg):
    """One line of GET /v1/sessions: what a session holds (an operator sees every tenant's)."""

    session_id: str
    tenant: str  # a hash of the API key that opened it, never the key
    num_variables: int
    num_calls: int
    num_calls_open: int  # waiting or running
    num_chars: int  # text stored: templates and input values
    idle_s: float


class SessionList(_Msg):
    sessions: list[SessionSummary]


# --- engines (operators) ----------------------------------------------------------------------


class RegisterEngineRequest(_Req):
    """An engine to schedule onto: a Parrot engine server (`kind` "parrot", the engine API), or any
    OpenAI-compatible completion server such as vLLM (`kind` "openai", through the manager's
    adapter; the other fields apply to it only)."""

    url: str = Field(min_length=1, max_length=2048, description="the engine server's base URL")
    max_running_calls: int | None = Field(default=None, ge=1, le=1_000_000, description="default: the manager's")
    kind: Literal["parrot", "openai"] = "parrot"
    model: str | None = Field(
        default=None, min_length=1, max_length=256, description="openai: the upstream's model (default: its first)"
    )
    tokenizer: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="openai: a Hugging Face model folder on the manager's machine with the model's tokenizer "
        "(default: the upstream model card's `root`, if that is such a folder)",
    )
    api_key: str | None = Field(default=None, min_length=1, max_length=4096, description="openai: the upstream's key")
    stream_interval: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="openai: tokens per streamed chunk asked of a vLLM upstream (its stream_interval)",
    )
    max_model_len: int | None = Field(
        default=None, ge=1, le=10_000_000, description="openai: default: the upstream model card's (vLLM reports it)"
    )


class EngineInfo(_Msg):
    engine_id: str
    url: str | None
    model: str
    alive: bool
    num_running_calls: int
    num_latency_calls: int
    latency_cap: int  # calls it may run while it hosts latency-critical work (calibrated)
    num_cached_prefixes: int
    num_blocks_free: int
    num_blocks_total: int
    # The engine's own counters since it started, as of its last heartbeat (EngineStats):
    num_prefill_tokens: int = 0  # prompt tokens it computed
    num_decode_tokens: int = 0  # tokens it generated
    num_reused_tokens: int = 0  # prompt tokens it took from a cached prefix instead of computing
    native_kernels: str = "none"  # builtin engine: which native CPU kernels run (or why none)


class EngineList(_Msg):
    engines: list[EngineInfo]


# --- variables --------------------------------------------------------------------------------


class VariableState(StrEnum):
    PENDING = "pending"  # no value yet (an unset input, or an output not finished)
    READY = "ready"
    ERROR = "error"


class VariableSpec(_Req):
    """Create a variable; with `value` it is an input that is already set."""

    var_id: str | None = Field(
        default=None, pattern=CLIENT_ID_PATTERN, description="client-chosen id; unique in the session"
    )
    name: str | None = Field(default=None, max_length=MAX_NAME_CHARS)
    value: str | None = Field(default=None, max_length=MAX_VALUE_CHARS)


class SetVariableRequest(_Req):
    """Set an input once: a value, or an error (a client-side native function failed), which its
    consumers then see as theirs."""

    value: str | None = Field(default=None, max_length=MAX_VALUE_CHARS)
    error: str | None = Field(default=None, max_length=4096)

    @model_validator(mode="after")
    def _one_of(self) -> SetVariableRequest:
        if (self.value is None) == (self.error is None):
            raise ValueError("give exactly one of value or error")
        return self


class VariableInfo(_Msg):
    var_id: str
    name: str | None
    state: VariableState
    producer_call_id: str | None
    num_consumers: int


class VariableList(_Msg):
    variables: list[VariableInfo]


class VariableValue(_Msg):
    """Answer of a get: the value when ready (errors are answered with their own status)."""

    var_id: str
    state: VariableState
    value: str | None = None
    # An output with scored choices (`score_choices`): each choice's log-probability given the prompt.
    scores: dict[str, float] | None = None


class StreamChunk(_Msg):
    """One NDJSON line of a streaming get; the last line has `done` or `error` set."""

    text: str = ""
    done: bool = False
    error: ErrorBody | None = None


# --- semantic calls ---------------------------------------------------------------------------


class Binding(_Req):
    """What a placeholder is bound to: a variable of the session, or (inputs only) an inline value."""

    var_id: str | None = Field(default=None, pattern=ID_PATTERN)
    value: str | None = Field(default=None, max_length=MAX_VALUE_CHARS)

    @model_validator(mode="after")
    def _one_of(self) -> Binding:
        if (self.var_id is None) == (self.value is None):
            raise ValueError("a binding has exactly one of var_id or value")
        return self


class ChatMessage(_Req):
    """One message of a chat-form call. `content` is template text: placeholders as in a template."""

    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=MAX_TEMPLATE_CHARS)


class CallSpec(_Req):
    """One semantic call: a template, its placeholder bindings and per-output sampling settings.

    The prompt is `template`, or `messages` (a chat-form call): the manager renders the messages
    with the model's own chat template, placeholders left unrendered (chat.py says how; the
    outputs are in assistant messages, the last output in the last message).

    Inputs must be bound. An output bound to `var_id` writes that (existing, unset, unproduced)
    variable; an unbound output gets a new variable. `sampling` is keyed by output name; outputs
    without an entry use `default_sampling`.
    """

    template: str | None = Field(default=None, min_length=1, max_length=MAX_TEMPLATE_CHARS)
    messages: list[ChatMessage] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_MESSAGES,
        description="instead of `template`: chat messages, rendered by the manager with the model's chat template",
    )
    bindings: dict[str, Binding] = Field(default_factory=dict, max_length=MAX_BINDINGS)
    sampling: dict[str, SamplingParams] = Field(default_factory=dict, max_length=MAX_BINDINGS)
    default_sampling: SamplingParams = Field(default_factory=SamplingParams)
    model: str | None = Field(default=None, max_length=256, description="an engine's model; default: the first")
    name: str | None = Field(default=None, max_length=MAX_NAME_CHARS, description="for status and logs")

    @model_validator(mode="after")
    def _one_prompt(self) -> CallSpec:
        if (self.template is None) == (self.messages is None):
            raise ValueError("give exactly one of template or messages")
        return self

    @property
    def num_chars(self) -> int:
        """The text of its prompt: the template, or every message's content."""
        if self.template is not None:
            return len(self.template)
        return sum(len(m.content) for m in self.messages or ())


class CallInfo(_Msg):
    call_id: str
    outputs: dict[str, str]  # output name -> var_id


class SubmitRequest(_Req):
    """A batch, applied all or nothing: variables are created first, then calls in order."""

    variables: list[VariableSpec] = Field(default_factory=list, max_length=MAX_BATCH_VARIABLES)
    calls: list[CallSpec] = Field(default_factory=list, max_length=MAX_BATCH_CALLS)
    # Variables the client is about to get, with the criteria of that get: objectives are deduced
    # with them before any call of the batch is dispatched (a get sent after the submit may arrive
    # after the dispatch, and an engine request keeps the priority it was sent with).
    awaited: dict[str, Annotated[Criteria, Field(strict=False)]] = Field(
        default_factory=dict, max_length=MAX_BATCH_VARIABLES
    )


class SubmitResponse(_Msg):
    variables: list[VariableInfo]
    calls: list[CallInfo]


class CreateSessionRequest(_Req):
    idle_timeout_s: float | None = Field(
        default=None, gt=0, le=86_400, description="expire the session after this long without requests"
    )
    submit: SubmitRequest | None = Field(
        default=None,
        description="the session's first batch, submitted with it: one request instead of two; if the batch "
        "is refused, no session is created (its errors name `submit.` fields)",
    )


class SessionCreated(_Msg):
    session_id: str
    token: str = Field(description="send as `Authorization: Bearer <token>` on every call of this session")
    idle_timeout_s: float
    submitted: SubmitResponse | None = Field(default=None, description="the answer to `submit`, when it was sent")


class RunRequest(_Req):
    """One batch run to its end in a session of its own, in one request (`POST /v1/run`): the
    session is created with the batch, the answer waits for `outputs` and the session is deleted
    before it is sent (a one-call app pays one request, not create, get and delete)."""

    submit: SubmitRequest
    outputs: list[str] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_BATCH_VARIABLES,
        description="variable ids of the batch to answer with (awaited with `criteria`); default: every output "
        "of its calls",
    )
    criteria: Criteria = Field(default=Criteria.LATENCY, strict=False)
    timeout_s: float = Field(
        default=MAX_GET_TIMEOUT_S,
        gt=0,
        le=MAX_GET_TIMEOUT_S,
        description="past it the run's calls are cancelled and the answer is 408",
    )


class RunResult(_Msg):
    submitted: SubmitResponse
    values: list[VariableValue] = Field(description="the outputs' values, in the order of `outputs`")
