"""OpenAI-compatible routes, served as one-call sessions of the manager.

Each request opens a session for the API key's tenant, submits one call whose template is the raw
prompt (never parsed for placeholders) followed by one output, streams or awaits that output and
deletes the session, which frees the engine context even when the client goes away mid-stream.
Requests share prompt prefixes like semantic calls do: hashed at chat-message boundaries and at
fixed token blocks (prefix.py); `usage.prompt_tokens_details.cached_tokens` reports the reuse.

`/v1/completions` also speaks the vLLM dialect an engine adapter needs: a prompt of token ids
(filled as given, never re-tokenized), `stop_token_ids`, and `logprobs: 0` (the sampled token's
logprob; engines report no alternatives, so `logprobs` > 0 is refused) with
`return_tokens_as_token_ids`. Each streamed chunk then carries the tokens generated since the
previous one, an EOS that ended the text included, as vLLM reports them.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Protocol

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ValidationError

from parrot.protocol.errors import ParrotError
from parrot.protocol.openai_api import (
    TOKEN_ID_PREFIX,
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    Completion,
    CompletionChoice,
    CompletionLogProbs,
    CompletionRequest,
    ModelCard,
    ModelList,
    PromptTokensDetails,
    Usage,
)
from parrot.protocol.public_api import CallSpec, ErrorResponse
from parrot.protocol.sampling import SamplingParams
from parrot.protocol.template import ParsedTemplate, Placeholder, PlaceholderKind, TextPiece
from parrot.serve.http.deps import ManagerDep
from parrot.serve.manager import Manager
from parrot.serve.runtime.call_run import CallRun
from parrot.serve.runtime.graph import CallNode
from parrot.serve.runtime.session import Session
from parrot.web.edge import BearerToken, error_body, unless_disconnected

_ERRORS: dict[int | str, dict[str, object]] = {code: {"model": ErrorResponse} for code in (400, 401, 404, 413)}
router = APIRouter(prefix="/v1", tags=["openai"], responses=_ERRORS)

_OUTPUT = "completion"
_FINISH = {"eos": "stop", "stop": "stop", "length": "length"}
_MAX_WAIT_S = 24 * 3600.0
_MAX_MESSAGE_POINTS = 16  # message boundaries considered for prefix sharing (the first and the latest)


@router.get("/models", response_model=ModelList)
async def list_models(api_key: BearerToken, manager: ManagerDep) -> ModelList:
    manager.sessions.tenant_of(api_key)
    cards = [ModelCard(id=m, max_model_len=manager.pool.for_model(m).max_model_len) for m in manager.pool.models]
    return ModelList(data=cards)


@router.post("/completions", response_model=Completion)
async def completions(
    req: CompletionRequest, api_key: BearerToken, manager: ManagerDep, request: Request
) -> Completion | StreamingResponse:
    _refuse_unsupported(req, {"echo": req.echo, "suffix": req.suffix}, logprobs_zero_ok=True)
    if req.best_of not in (None, 1):
        raise ParrotError("best_of > 1 is not supported", field="best_of")
    prompt = _one_prompt(req.prompt)
    run = _OneCall(manager, api_key, req.model, prompt, req, default_max_tokens=16)
    if req.logprobs is not None and req.logprobs is not False:  # 0: the only value let through
        run.token_report = _TokenReport(run, req.return_tokens_as_token_ids)
    if req.stream:
        return StreamingResponse(run.stream_sse(_completion_chunk), media_type="text/event-stream")
    text, finish_reason, usage = await run.complete(request)
    logprobs = run.token_report.take(final=True) if run.token_report else None
    choice = CompletionChoice(text=text, finish_reason=finish_reason, logprobs=logprobs)
    return Completion(id=run.id, created=run.created, model=req.model, choices=[choice], usage=usage)


@router.post("/chat/completions", response_model=ChatCompletion)
async def chat_completions(
    req: ChatCompletionRequest, api_key: BearerToken, manager: ManagerDep, request: Request
) -> ChatCompletion | StreamingResponse:
    _refuse_unsupported(req, {"top_logprobs": req.top_logprobs})
    model = manager.pool.resolve_model(req.model)
    tokenizer = manager.pool.for_model(model).tokenizer
    messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in req.messages]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    # Prefix points at message boundaries (the system prompt, the conversation so far).
    counts = list(range(1, len(messages) + 1))
    if len(counts) > _MAX_MESSAGE_POINTS:
        counts = [1, *counts[-(_MAX_MESSAGE_POINTS - 1) :]]
    prefixes = [tokenizer.apply_chat_template(messages[:k], add_generation_prompt=False) for k in counts]
    max_tokens = req.max_completion_tokens or req.max_tokens
    run = _OneCall(
        manager, api_key, req.model, prompt, req, default_max_tokens=None, max_tokens=max_tokens, prefixes=prefixes
    )
    if req.stream:
        return StreamingResponse(run.stream_sse(_chat_chunk), media_type="text/event-stream")
    text, finish_reason, usage = await run.complete(request)
    choice = ChatChoice(message=AssistantMessage(content=text), finish_reason=finish_reason)
    return ChatCompletion(id=run.id, created=run.created, model=req.model, choices=[choice], usage=usage)


def _one_prompt(prompt: str | list[str] | list[int] | list[list[int]]) -> str | list[int]:
    """The request's one prompt: text or token ids (`[1, 2]` is one prompt, `[[1, 2]]` a list of one)."""
    if isinstance(prompt, str):
        return prompt
    items: list[Any] = list(prompt)
    if items and all(isinstance(t, int) for t in items):
        return items
    if len(items) != 1:
        raise ParrotError("exactly one prompt is supported per request", field="prompt")
    first = items[0]
    return first if isinstance(first, str) else list(first)


def _refuse_unsupported(
    req: CompletionRequest | ChatCompletionRequest, extra: dict[str, object], logprobs_zero_ok: bool = False
) -> None:
    if req.n not in (None, 1):
        raise ParrotError("n > 1 is not supported: send one request per choice", field="n")
    if logprobs_zero_ok and req.logprobs is not None and (req.logprobs is True or req.logprobs != 0):
        raise ParrotError(
            "only logprobs=0 is supported (the sampled token's logprob): engines report no top alternatives",
            field="logprobs",
        )
    if (not logprobs_zero_ok and req.logprobs not in (None, False, 0)) or req.logit_bias:
        raise ParrotError(
            "logprobs and logit_bias are not supported", field="logprobs" if req.logprobs else "logit_bias"
        )
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(req, name) not in (None, 0, 0.0):
            raise ParrotError(f"{name} is not supported (only 0)", field=name)
    for name, value in extra.items():
        if value not in (None, False):
            raise ParrotError(f"{name} is not supported", field=name)


class _OneCall:
    """One request as a one-call session; created, then deleted when the answer is complete."""

    def __init__(
        self,
        manager: Manager,
        api_key: str | None,
        model: str,
        prompt: str | list[int],
        req: CompletionRequest | ChatCompletionRequest,
        default_max_tokens: int | None,
        max_tokens: int | None = None,
        prefixes: list[str] | None = None,
    ) -> None:
        self.manager = manager
        self.model = model
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        resolved = manager.pool.resolve_model(model)
        if not prompt:
            raise ParrotError("the prompt is empty", field="prompt")
        engine = manager.pool.for_model(resolved)
        self.tokenizer = engine.tokenizer
        prompt_token_ids = None
        if isinstance(prompt, list):
            vocab_size = engine.tokenizer.vocab_size
            bad = next((t for t in prompt if not 0 <= t < vocab_size), None)
            if bad is not None:
                raise ParrotError(f"token id {bad} is outside the vocabulary [0, {vocab_size})", field="prompt")
            prompt_token_ids = prompt
            prompt = engine.tokenizer.decode(prompt, skip_special_tokens=False) or "(token ids)"
        max_tokens = max_tokens or req.max_tokens or default_max_tokens
        if max_tokens is None:  # chat default: whatever room the context leaves
            max_tokens = max(1, min(32768, engine.max_model_len - len(engine.tokenizer.encode(prompt))))
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        sampling = _sampling(
            max_tokens=max_tokens,
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p,
            seed=req.seed,
            stop=stop,
            top_k=req.top_k or 0,
            ignore_eos=req.ignore_eos,
            stop_token_ids=req.stop_token_ids or [],
        )
        self.include_usage = bool(req.stream_options and req.stream_options.include_usage)
        self.token_report: _TokenReport | None = None  # per-token logprobs, when asked for
        created = manager.create_session(api_key)
        self.session: Session = manager.sessions.sessions[created.session_id]
        template = ParsedTemplate((TextPiece(prompt), Placeholder(_OUTPUT, PlaceholderKind.OUTPUT)), (), (_OUTPUT,))
        try:
            spec = CallSpec(template=prompt, sampling={_OUTPUT: sampling}, model=resolved, name="openai")
            self.call: CallNode = manager.submit_parsed(self.session, spec, template, prefixes or [], prompt_token_ids)
        except BaseException:
            self.manager.sessions.remove(self.session.session_id, "closed")
            raise
        self.record: CallRun = self.session.runs[self.call.call_id]  # usage, finish reason, tokens
        self.var = self.session.graph.variables[self.call.outputs[_OUTPUT]]

    def usage(self) -> Usage:
        c = self.record
        return Usage(
            prompt_tokens=c.num_prompt_tokens,
            completion_tokens=c.num_generated_tokens,
            total_tokens=c.num_prompt_tokens + c.num_generated_tokens,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=c.num_cached_tokens),
        )

    def finish_reason(self) -> str | None:
        reason = self.record.finish_reasons.get(_OUTPUT)
        return None if reason is None else _FINISH.get(reason, reason)

    async def complete(self, request: Request | None = None) -> tuple[str, str | None, Usage]:
        """The whole answer; a client (`request`) that disconnects first ends the call (its engine
        work stops)."""
        try:
            wait = self.var.wait(_MAX_WAIT_S)
            await (wait if request is None else unless_disconnected(request, wait))
            if self.var.error is not None:
                raise self.var.error
            assert self.var.value is not None
            return self.var.value, self.finish_reason(), self.usage()
        finally:
            await self.manager.delete_session(self.session, "closed")

    async def stream_sse(self, make_chunk: _ChunkMaker) -> AsyncIterator[str]:
        try:
            yield _sse(make_chunk(self, None, None, first=True))
            report = self.token_report
            try:
                # With a token report, each chunk pairs the text with the tokens generated so far.
                async for text in self.var.stream(joined=report is not None):
                    yield _sse(make_chunk(self, text, None, first=False, logprobs=report.take() if report else None))
            except ParrotError as e:
                yield f"data: {_json(error_body(e))}\n\n"
                return
            last = report.take(final=True) if report else None  # tokens without text of their own, an ending EOS
            yield _sse(make_chunk(self, None, self.finish_reason(), first=False, logprobs=last))
            if self.include_usage:
                yield _sse(make_chunk(self, None, None, first=False, usage=self.usage()))
            yield "data: [DONE]\n\n"
        finally:
            await self.manager.delete_session(self.session, "closed")


def _sampling(**fields: Any) -> SamplingParams:
    """The request's sampling settings under the engines' limits: 400 naming the field, not a 500."""
    try:
        return SamplingParams(**fields)
    except ValidationError as e:
        first = e.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or None
        raise ParrotError(f"{field}: {first['msg']}", field=field) from None


class _TokenReport:
    """The output's tokens as vLLM reports them with `logprobs: 0`; `take()` returns those
    generated since the last take (the OpenAI text offsets run on from one take to the next)."""

    def __init__(self, run: _OneCall, as_token_ids: bool) -> None:
        self.run = run
        self.as_token_ids = as_token_ids
        self.num_taken = 0
        self.text_offset = 0

    def take(self, final: bool = False) -> CompletionLogProbs:
        """`final`: the output is complete; before that, an EOS the engine streamed (the one token
        outside the context's) waits, so that it arrives with the finish reason, as in vLLM."""
        record = self.run.record
        streamed = record.output_tokens.get(_OUTPUT, [])
        stop = len(streamed) if final else min(len(streamed), len(record.output_token_ids.get(_OUTPUT, [])))
        tokens = streamed[self.num_taken : stop]
        self.num_taken += len(tokens)
        report = CompletionLogProbs(text_offset=[], token_logprobs=[], tokens=[], top_logprobs=[])
        for token_id, logprob in tokens:
            text = self.run.tokenizer.decode([token_id], skip_special_tokens=False)
            token = f"{TOKEN_ID_PREFIX}{token_id}" if self.as_token_ids else text
            report.text_offset.append(self.text_offset)
            report.token_logprobs.append(logprob)
            report.tokens.append(token)
            report.top_logprobs.append(None if logprob is None else {token: logprob})
            self.text_offset += len(text)
        return report


class _ChunkMaker(Protocol):
    def __call__(
        self,
        run: _OneCall,
        text: str | None,
        finish_reason: str | None,
        first: bool,
        usage: Usage | None = None,
        logprobs: CompletionLogProbs | None = None,
    ) -> BaseModel: ...


def _completion_chunk(
    run: _OneCall,
    text: str | None,
    finish_reason: str | None,
    first: bool,
    usage: Usage | None = None,
    logprobs: CompletionLogProbs | None = None,
) -> BaseModel:
    choices = [] if usage else [CompletionChoice(text=text or "", finish_reason=finish_reason, logprobs=logprobs)]
    return Completion(id=run.id, created=run.created, model=run.model, choices=choices, usage=usage)


def _chat_chunk(
    run: _OneCall,
    text: str | None,
    finish_reason: str | None,
    first: bool,
    usage: Usage | None = None,
    logprobs: CompletionLogProbs | None = None,
) -> BaseModel:
    delta = ChatDelta(role="assistant", content="") if first else ChatDelta(content=text)
    choices = [] if usage else [ChatChunkChoice(delta=delta, finish_reason=finish_reason)]
    return ChatCompletionChunk(id=run.id, created=run.created, model=run.model, choices=choices, usage=usage)


def _sse(chunk: BaseModel) -> str:
    return f"data: {chunk.model_dump_json(exclude_none=False)}\n\n"


def _json(body: object) -> str:
    return json.dumps(body)
