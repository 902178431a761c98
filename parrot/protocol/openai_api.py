"""OpenAI-compatible request and response messages (/v1/completions, /v1/chat/completions, /v1/models).

Only what the manager serves faithfully is accepted: an option it would ignore (n > 1, top
logprobs, penalties, echo...) is refused with a 400 naming it, never dropped silently. Unknown
fields are refused too. A few vLLM extensions are served as vLLM serves them: `ignore_eos`,
`top_k`, `stop_token_ids`, token-id prompts and `return_tokens_as_token_ids` (tokens reported as
"token_id:<n>"), which is what Parrot's own OpenAI engine adapter (parrot/serve/openai_engine.py)
asks of an upstream.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from parrot.protocol.public_api import MAX_VALUE_CHARS


class _Req(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # `true` is not 1, "5" is not 5


class StreamOptions(_Req):
    include_usage: bool = False


class _SamplingFields(_Req):
    model: str = Field(max_length=256)
    max_tokens: int | None = Field(default=None, ge=1, le=32768)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int | None = Field(default=None, ge=1, le=128)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0)
    user: str | None = Field(default=None, max_length=256)
    # Extensions that vLLM also accepts (OpenAI clients send them with `extra_body`).
    ignore_eos: bool = False
    top_k: int | None = Field(default=None, ge=0, le=1_000_000)
    stop_token_ids: list[int] | None = Field(default=None, max_length=64)
    # Accepted only at their neutral values; anything else is a 400 (not supported).
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logprobs: bool | int | None = None
    logit_bias: dict[str, float] | None = None


TOKEN_ID_PREFIX = "token_id:"  # vLLM's spelling of a token under `return_tokens_as_token_ids`


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]] = Field(
        description="one prompt: text, or token ids (a list of prompts must hold exactly one)"
    )
    echo: bool | None = None
    best_of: int | None = None
    suffix: str | None = None
    # With `logprobs`, each token is reported as "token_id:<n>" instead of its text (vLLM).
    return_tokens_as_token_ids: bool = False


class ContentPart(_Req):
    type: Literal["text"]
    text: str = Field(max_length=MAX_VALUE_CHARS)


class ChatMessage(_Req):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] = Field(max_length=MAX_VALUE_CHARS)
    name: str | None = Field(default=None, max_length=256)

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1, max_length=4096)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=32768)
    top_logprobs: int | None = None


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


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: None = None


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
