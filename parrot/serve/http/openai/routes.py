"""OpenAI-compatible routes: `/v1/models`, `/v1/completions`, `/v1/chat/completions`.

Each request is a session of one call per choice (call.py). Requests share prompt prefixes like
semantic calls do: hashed at chat-message boundaries and at fixed token blocks (prefix.py);
`usage.prompt_tokens_details.cached_tokens` reports the reuse.

`/v1/completions` also speaks the vLLM dialect an engine adapter needs: a prompt of token ids
(filled as given, never re-tokenized), `stop_token_ids`, `logprobs` with
`return_tokens_as_token_ids`. Each streamed chunk then carries the tokens generated since the
previous one, an EOS that ended the text included, as vLLM reports them.

Chat with `tools`: the tools are described in the prompt (parrot/text/tools.py) and the output is
read back as tool calls; `tool_choice` required or named constrains it to one call's JSON. A
stream with tools streams content up to a tool-call tag and sends the calls in one delta when the
choice ends (a partial call is not a call yet); a forced call comes whole at the end.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from parrot.protocol.errors import ParrotError
from parrot.protocol.openai_api import (
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
    FunctionCall,
    ModelCard,
    ModelList,
    ToolCall,
    ToolCallDelta,
)
from parrot.protocol.public_api import MAX_TEMPLATE_CHARS, ErrorResponse
from parrot.serve.http.deps import ManagerDep
from parrot.serve.http.openai.call import OUTPUT, OneCall
from parrot.serve.http.openai.params import Request as OpenAIRequest
from parrot.serve.http.openai.params import (
    ToolUse,
    choice_seed,
    constraint,
    request_field,
    sampling_params,
    tool_use,
)
from parrot.serve.http.openai.report import TokenReport
from parrot.serve.manager import Manager
from parrot.text import ChatTemplateError, Tokenizer
from parrot.text.tools import parse_tool_calls, read_call, streamable_len
from parrot.web.edge import BearerToken, error_body

_OFFLOAD_CHARS = 100_000  # a prompt longer than this is tokenized on a worker thread
_ERRORS: dict[int | str, dict[str, object]] = {code: {"model": ErrorResponse} for code in (400, 401, 404, 413)}
router = APIRouter(prefix="/v1", tags=["openai"], responses=_ERRORS)

_MAX_MESSAGE_POINTS = 16  # message boundaries considered for prefix sharing (the first and the latest)


@router.get("/models", response_model=ModelList)
async def list_models(api_key: BearerToken, manager: ManagerDep) -> ModelList:
    manager.sessions.tenant_of(api_key)
    cards = [ModelCard(id=m, max_model_len=manager.pool.for_model(m).max_model_len) for m in manager.pool.models]
    return ModelList(data=cards)


def new_call(
    manager: Manager,
    api_key: str | None,
    req: OpenAIRequest,
    prompt: str | list[int],
    max_tokens: int,
    top_logprobs: int,
    constrained: tuple[dict[str, Any], str | None],
    prefixes: list[list[int]] | None = None,
    prompt_ids: list[int] | None = None,
) -> OneCall:
    """The request's `n` choices as calls; a seeded request's choices get seeds of their own.
    `constrained`: the constraint's sampling fields and the request field they come from."""
    extra, field = constrained
    n = req.n or 1
    sampling = [
        sampling_params(req, max_tokens, top_logprobs, {**extra, "seed": choice_seed(req.seed, i)}) for i in range(n)
    ]
    prompt_field = "prompt" if isinstance(req, CompletionRequest) else "messages"
    rename = lambda e: request_field(e, field)  # noqa: E731
    run = OneCall(manager, api_key, req.model, prompt, sampling, prefixes, rename, prompt_field, prompt_ids)
    for choice in run.choices:  # before any await, so before the calls are dispatched
        choice.var.watched = bool(req.stream)
        choice.var.logprobs_read = req.logprobs is not None and req.logprobs is not False  # completions: 0 asks
    run.stream_interval = req.stream_interval or 1
    return run


@router.post("/completions", response_model=Completion)
async def completions(
    req: CompletionRequest, api_key: BearerToken, manager: ManagerDep, request: Request
) -> Completion | StreamingResponse:
    if req.suffix is not None:
        raise ParrotError("suffix is not supported", field="suffix")
    if req.best_of not in (None, req.n or 1):
        raise ParrotError("best_of must equal n (choices are not ranked server-side)", field="best_of")
    prompt = _one_prompt(req.prompt)
    prompt_ids = None
    if isinstance(prompt, str) and _OFFLOAD_CHARS < len(prompt) <= MAX_TEMPLATE_CHARS:  # off the event loop
        tokenizer = manager.pool.for_model(manager.pool.resolve_model(req.model)).tokenizer
        prompt_ids = (await asyncio.to_thread(tokenizer.encode_offsets, prompt))[0]
    top = req.logprobs or 0
    extra, field = constraint(req)
    if req.echo and req.logprobs is not None:  # the prompt's logprobs too: one scoring fill of it
        extra = {**extra, "prompt_logprobs": req.logprobs}
    run = new_call(manager, api_key, req, prompt, req.max_tokens or 16, top, (extra, field), None, prompt_ids)
    reports = None
    if req.logprobs is not None:
        reports = [TokenReport(c.record, OUTPUT, run.tokenizer, req.return_tokens_as_token_ids) for c in run.choices]
    echo = run.prompt_text if req.echo else ""
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return _sse_response(run, _completion_stream(run, reports, echo, include_usage))
    texts = await run.complete(request)
    choices = [
        CompletionChoice(
            index=c.index,
            text=echo + text,
            finish_reason=c.finish_reason(),
            logprobs=_echoed(reports[c.index], bool(echo)) if reports else None,
        )
        for c, text in zip(run.choices, texts, strict=True)
    ]
    return Completion(id=run.id, created=run.created, model=req.model, choices=choices, usage=run.usage())


def _echoed(report: TokenReport, echo: bool) -> CompletionLogProbs:
    """A whole choice's logprobs: the echoed prompt's tokens first, when it is echoed (the text
    offsets run on from the prompt's into the output's)."""
    if not echo:
        return report.take(final=True)
    prompt = report.take_prompt()
    output = report.take(final=True)
    return CompletionLogProbs(
        text_offset=prompt.text_offset + output.text_offset,
        token_logprobs=prompt.token_logprobs + output.token_logprobs,
        tokens=prompt.tokens + output.tokens,
        top_logprobs=prompt.top_logprobs + output.top_logprobs,
    )


async def _completion_stream(
    run: OneCall, reports: list[TokenReport] | None, echo: str, include_usage: bool
) -> AsyncIterator[BaseModel]:
    def chunk(choices: list[CompletionChoice], usage: Any = None) -> Completion:
        return Completion(id=run.id, created=run.created, model=run.model, choices=choices, usage=usage)

    scored_echo = bool(echo and reports)  # the echoed prompt comes with its logprobs, once computed
    if not scored_echo:
        yield chunk([CompletionChoice(index=c.index, text=echo, finish_reason=None) for c in run.choices])
    echoed: set[int] = set()
    async for choice, text in run.chunks(reports is not None, run.stream_interval):
        report = reports[choice.index] if reports else None
        if scored_echo and report is not None and choice.index not in echoed:
            echoed.add(choice.index)
            yield chunk(
                [CompletionChoice(index=choice.index, text=echo, finish_reason=None, logprobs=report.take_prompt())]
            )
        finish = None if text is not None else choice.finish_reason()
        # The last take holds tokens without text of their own (an ending EOS).
        logprobs = report.take(final=text is None) if report else None
        yield chunk([CompletionChoice(index=choice.index, text=text or "", finish_reason=finish, logprobs=logprobs)])
    if include_usage:
        yield chunk([], run.usage())


@router.post("/chat/completions", response_model=ChatCompletion)
async def chat_completions(
    req: ChatCompletionRequest, api_key: BearerToken, manager: ManagerDep, request: Request
) -> ChatCompletion | StreamingResponse:
    if req.top_logprobs and not req.logprobs:
        raise ParrotError("top_logprobs needs logprobs: true", field="top_logprobs")
    tools = tool_use(req)
    engine = manager.pool.for_model(manager.pool.resolve_model(req.model))
    tokenizer = engine.tokenizer
    messages = [_message(m.model_dump(exclude_none=True), m.text()) for m in req.messages]
    num_chars = sum(len(m["content"]) for m in messages)
    if num_chars > MAX_TEMPLATE_CHARS:  # before rendering it (seconds of work for megabytes)
        msg = f"the messages hold {num_chars:,} characters; at most {MAX_TEMPLATE_CHARS:,} are accepted"
        raise ParrotError(msg, status=413, field="messages")
    described = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    # Rendering and tokenizing a long conversation takes seconds: off the event loop.
    try:
        prompt, prompt_ids, prefix_ids = await asyncio.to_thread(_render_chat, tokenizer, messages, described)
    except ChatTemplateError as e:
        raise ParrotError(f"the model's chat template refused the messages: {e}", field="messages") from None
    max_tokens = req.max_completion_tokens or req.max_tokens
    if max_tokens is None:  # whatever room the context leaves
        max_tokens = max(1, min(32768, engine.max_model_len - len(prompt_ids)))
    top = (req.top_logprobs or 0) if req.logprobs else 0
    run = new_call(manager, api_key, req, prompt, max_tokens, top, constraint(req, tools), prefix_ids, prompt_ids)
    reports = [TokenReport(c.record, OUTPUT, run.tokenizer) for c in run.choices] if req.logprobs else None
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return _sse_response(run, _chat_stream(run, reports, tools, include_usage))
    texts = await run.complete(request)
    choices = []
    for c, text in zip(run.choices, texts, strict=True):
        content, calls, finish = _chat_output(text, c.finish_reason(), tools)
        logprobs = reports[c.index].take_chat(final=True) if reports else None
        message = AssistantMessage(content=content, tool_calls=calls)
        choices.append(ChatChoice(index=c.index, message=message, finish_reason=finish, logprobs=logprobs))
    return ChatCompletion(id=run.id, created=run.created, model=req.model, choices=choices, usage=run.usage())


def _render_chat(
    tokenizer: Tokenizer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> tuple[str, list[int], list[list[int]]]:
    """The prompt, its tokens, and the tokens of its prefixes at message boundaries (the system
    prompt, the conversation so far)."""
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tools=tools)
    counts = list(range(1, len(messages) + 1))
    if len(counts) > _MAX_MESSAGE_POINTS:
        counts = [1, *counts[-(_MAX_MESSAGE_POINTS - 1) :]]
    prefixes = [tokenizer.apply_chat_template(messages[:k], False, tools=tools) for k in counts]
    # Through the tokenizer's recent texts: the prefixes are tokenized from the prompt's tokens
    # (each begins it), a system prompt from the last request's that had it.
    ids = tokenizer.encode_offsets(prompt)[0]
    return prompt, ids, [tokenizer.encode_offsets(p)[0] for p in prefixes]


def _message(m: dict[str, Any], text: str) -> dict[str, Any]:
    """A request message as the chat template takes it: text content, `developer` as `system`."""
    m["role"] = "system" if m["role"] == "developer" else m["role"]
    m["content"] = text
    return m


def _chat_output(
    text: str, finish_reason: str | None, tools: ToolUse | None
) -> tuple[str | None, list[ToolCall] | None, str | None]:
    """(content, tool calls, finish reason) of one choice's text."""
    if tools is None:
        return text, None, finish_reason
    if tools.forced:
        call = read_call(text, tools.names)
        content, calls = (None, [call]) if call is not None else (text, [])
    else:
        content, calls = parse_tool_calls(text, tools.names)
    if not calls:
        return content, None, finish_reason
    made = [
        ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", function=FunctionCall(name=name, arguments=arguments))
        for name, arguments in calls
    ]
    return content, made, "tool_calls"


async def _chat_stream(
    run: OneCall, reports: list[TokenReport] | None, tools: ToolUse | None, include_usage: bool
) -> AsyncIterator[BaseModel]:
    def chunk(choices: list[ChatChunkChoice], usage: Any = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=run.id, created=run.created, model=run.model, choices=choices, usage=usage)

    for c in run.choices:
        yield chunk([ChatChunkChoice(index=c.index, delta=ChatDelta(role="assistant", content=""))])
    # With tools, each choice's text so far and how much of it went out as content: a forced call
    # streams nothing until it ends; otherwise content streams up to a tool-call tag.
    held, sent = [""] * len(run.choices), [0] * len(run.choices)
    async for choice, text in run.chunks(reports is not None, run.stream_interval):
        i = choice.index
        report = reports[i] if reports else None
        logprobs = report.take_chat(final=text is None) if report else None
        if text is not None and tools is not None:
            held[i] += text
            stop = sent[i] if tools.forced else max(sent[i], streamable_len(held[i]))
            text, sent[i] = held[i][sent[i] : stop], stop
            if not text and logprobs is None:
                continue
        if text is not None:
            yield chunk([ChatChunkChoice(index=i, delta=ChatDelta(content=text), logprobs=logprobs)])
            continue
        finish = choice.finish_reason()
        delta = ChatDelta()
        if tools is not None:
            content, calls, finish = _chat_output(held[i][sent[i] :], finish, tools)
            deltas = [ToolCallDelta(index=k, id=t.id, function=t.function) for k, t in enumerate(calls or [])]
            delta = ChatDelta(content=content or None, tool_calls=deltas or None)
        yield chunk([ChatChunkChoice(index=i, delta=delta, finish_reason=finish, logprobs=logprobs)])
    if include_usage:
        yield chunk([], run.usage())


def _sse_response(run: OneCall, chunks: AsyncIterator[BaseModel]) -> StreamingResponse:
    return StreamingResponse(_sse(run, chunks), media_type="text/event-stream")


async def _sse(run: OneCall, chunks: AsyncIterator[BaseModel]) -> AsyncIterator[str]:
    """Server-sent events; an error mid-stream is one event with the error body. The run's
    session is deleted when the stream ends, however it ends (a client gone included)."""
    try:
        try:
            async for c in chunks:
                yield f"data: {c.model_dump_json(exclude_none=False)}\n\n"
        except ParrotError as e:
            yield f"data: {json.dumps(error_body(e))}\n\n"
            return
        yield "data: [DONE]\n\n"
    finally:
        await run.close()


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
