"""OpenAI-compatible request and response messages (/v1/completions, /v1/chat/completions, /v1/models).

Only what the manager serves faithfully is accepted: an option it would ignore (`suffix`,
`best_of` > n, echo with logprobs...) is refused with a 400 naming it, never dropped silently.
Unknown fields are refused too. Served: `n`, `logprobs` (completions: 0..20 alternatives; chat:
with `top_logprobs` 0..20), `echo`, presence/frequency penalties, `logit_bias`, `response_format`
(json_object, json_schema), `tools` with `tool_choice` and tool messages. A few vLLM extensions
are served as vLLM serves them: `ignore_eos`, `top_k`, `repetition_penalty`, `stop_token_ids`,
`structured_outputs` (json, regex, choice), token-id prompts and `return_tokens_as_token_ids`
(tokens reported as "token_id:<n>"), which is what Parrot's own OpenAI engine adapter
(parrot/backends/openai_engine.py) asks of an upstream.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from parrot.protocol.public_api import MAX_VALUE_CHARS

MAX_N = 64  # choices per request (each is a call sharing the prompt)
MAX_TOP_LOGPROBS = 20
MAX_TOOLS = 128


class _Req(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # `true` is not 1, "5" is not 5


class JsonSchemaFormat(_Req):
    name: str = Field(default="output", max_length=64)
    description: str | None = Field(default=None, max_length=4096)
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Req):
    """`json_object`: the output is a JSON object; `json_schema`: valid against the schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(_Req):
    """vLLM's constrained output (at most one): `json` (a schema), `regex` or `choice`."""

    json_: dict[str, Any] | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None


class StreamOptions(_Req):
    include_usage: bool = False


class _SamplingFields(_Req):
    model: str = Field(max_length=256)
    max_tokens: int | None = Field(default=None, ge=1, le=32768)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int | None = Field(default=None, ge=1, le=MAX_N)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0)
    user: str | None = Field(default=None, max_length=256)
    # Extensions that vLLM also accepts (OpenAI clients send them with `extra_body`).
    ignore_eos: bool = False
    top_k: int | None = Field(default=None, ge=0, le=1_000_000)
    stop_token_ids: list[int] | None = Field(default=None, max_length=64)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=10.0)
    structured_outputs: StructuredOutputs | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = Field(default=None, max_length=1024)
    response_format: ResponseFormat | None = None
    stream_interval: int | None = Field(default=None, ge=1, le=4096)  # vLLM's: tokens per streamed chunk


TOKEN_ID_PREFIX = "token_id:"  # vLLM's spelling of a token under `return_tokens_as_token_ids`


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]] = Field(
        description="one prompt: text, or token ids (a list of prompts must hold exactly one)"
    )
    logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)  # a count, not a flag
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None
    # With `logprobs`, each token is reported as "token_id:<n>" instead of its text (vLLM).
    return_tokens_as_token_ids: bool = False


class ContentPart(_Req):
    type: Literal["text"]
    text: str = Field(max_length=MAX_VALUE_CHARS)


class FunctionCall(BaseModel):
    name: str = Field(max_length=256)
    arguments: str = Field(max_length=MAX_VALUE_CHARS)  # a JSON object, as text


class ToolCall(BaseModel):
    id: str = Field(max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Req):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = Field(default=None, max_length=MAX_VALUE_CHARS)
    name: str | None = Field(default=None, max_length=256)
    tool_calls: list[ToolCall] | None = Field(default=None, max_length=MAX_TOOLS)  # an assistant's
    tool_call_id: str | None = Field(default=None, max_length=256)  # a tool result's

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class FunctionSpec(_Req):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = Field(default=None, max_length=4096)
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Req):
    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(_Req):
    name: str = Field(max_length=64)


class NamedToolChoice(_Req):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1, max_length=4096)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=32768)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Tool] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class CompletionLogProbs(BaseModel):
    """Per generated token (vLLM's shape): its text or "token_id:<n>", its logprob, its offset."""

    text_offset: list[int]
    token_logprobs: list[float | None]
    tokens: list[str]
    top_logprobs: list[dict[str, float] | None]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None
    logprobs: CompletionLogProbs | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprobEntry(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class ChatTokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprobEntry]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None
    logprobs: ChatLogprobs | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ToolCallDelta(BaseModel):
    index: int
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "parrot"
    max_model_len: int | None = None  # vLLM's field: the model's context length in tokens


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
