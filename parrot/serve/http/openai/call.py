"""One OpenAI request as a session of `n` calls (one per choice) sharing one prompt.

The session is created with the request and deleted when the answer is complete, which frees
the engine contexts even when the client goes away mid-stream. With `n` > 1 the calls are forks
of one filled prompt (Manager.submit_parsed). A stream merges the choices' chunks as they come.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from fastapi import Request

from parrot.protocol.engine_api import check_token_ids
from parrot.protocol.errors import ParrotError
from parrot.protocol.openai_api import PromptTokensDetails, Usage
from parrot.protocol.public_api import MAX_TEMPLATE_CHARS, CallSpec
from parrot.protocol.sampling import SamplingParams
from parrot.protocol.template import ParsedTemplate, Placeholder, PlaceholderKind, TextPiece
from parrot.serve.manager import Manager
from parrot.serve.runtime.call_run import CallRun
from parrot.serve.runtime.session import Session
from parrot.serve.runtime.variable import Variable
from parrot.web.edge import unless_disconnected

OUTPUT = "completion"
_FINISH = {"eos": "stop", "stop": "stop", "length": "length"}
_MAX_WAIT_S = 24 * 3600.0


@dataclass
class Choice:
    index: int
    record: CallRun  # usage, finish reason, tokens
    var: Variable

    def finish_reason(self) -> str | None:
        reason = self.record.finish_reasons.get(OUTPUT)
        return None if reason is None else _FINISH.get(reason, reason)


class OneCall:
    """Validates and submits at once (errors are 4xx before any response starts)."""

    def __init__(
        self,
        manager: Manager,
        api_key: str | None,
        model: str,
        prompt: str | list[int],
        sampling: list[SamplingParams],
        prefixes: list[list[int]] | None = None,
        rename: Callable[[ParrotError], ParrotError] = lambda e: e,
        prompt_field: str = "prompt",
        prompt_ids: list[int] | None = None,
    ) -> None:
        """`prompt`: text, or token ids (filled as given); `sampling`: one per choice; `rename`:
        an engine's error about the sampling as one about the request's field; `prompt_field`: the
        request field the prompt comes from (errors about its size name it); `prompt_ids`: a text
        prompt's tokens, when the route tokenized it (off the event loop); `prefixes`: the token
        ids of its leading chat messages."""
        self.manager = manager
        self.rename = rename
        self.stream_interval = 1  # tokens per streamed chunk, at least (vLLM's `stream_interval`)
        self.model = model
        self.id = f"cmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        resolved = manager.pool.resolve_model(model)
        if not prompt:
            raise ParrotError("the prompt is empty", field="prompt")
        engine = manager.pool.for_model(resolved)
        self.tokenizer = engine.tokenizer
        prompt_token_ids = prompt_ids
        if isinstance(prompt, list):
            check_token_ids(prompt, engine.tokenizer.vocab_size, field="prompt")
            prompt_token_ids = prompt
            prompt = engine.tokenizer.decode(prompt, skip_special_tokens=False) or "(token ids)"
        self.prompt_text = prompt
        if len(prompt) > MAX_TEMPLATE_CHARS:
            msg = f"the prompt has {len(prompt):,} characters; at most {MAX_TEMPLATE_CHARS:,} are accepted"
            raise ParrotError(msg, status=413, field=prompt_field)
        bad = next((t for t in sampling[0].logit_bias if t >= engine.tokenizer.vocab_size), None)
        if bad is not None:
            raise ParrotError(
                f"logit_bias: token id {bad} is outside the vocabulary [0, {engine.tokenizer.vocab_size})",
                field="logit_bias",
            )
        created = manager.create_session(api_key)
        self.session: Session = manager.sessions.sessions[created.session_id]
        template = ParsedTemplate((TextPiece(prompt), Placeholder(OUTPUT, PlaceholderKind.OUTPUT)), (), (OUTPUT,))
        try:
            specs = [CallSpec(template=prompt, sampling={OUTPUT: s}, model=resolved, name="openai") for s in sampling]
            calls = manager.submit_parsed(self.session, specs, template, prefixes or [], prompt_token_ids)
        except BaseException as e:
            self.manager.sessions.remove(self.session.session_id, "closed")
            if isinstance(e, ParrotError) and (e.field or "").endswith("template"):  # the call's: the request's
                raise ParrotError(e.message, status=e.status, field=prompt_field) from None
            raise
        graph = self.session.graph
        self.choices = [
            Choice(i, self.session.runs[c.call_id], graph.variables[c.outputs[OUTPUT]]) for i, c in enumerate(calls)
        ]

    def usage(self) -> Usage:
        """The prompt counts once (the choices share it); completion tokens of every choice."""
        first = self.choices[0].record
        num_generated = sum(c.record.num_generated_tokens for c in self.choices)
        return Usage(
            prompt_tokens=first.num_prompt_tokens,
            completion_tokens=num_generated,
            total_tokens=first.num_prompt_tokens + num_generated,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=first.num_cached_tokens),
        )

    async def complete(self, request: Request | None = None) -> list[str]:
        """Every choice's whole text; a client (`request`) that disconnects first ends the calls
        (their engine work stops)."""
        try:
            wait = asyncio.gather(*(c.var.wait(_MAX_WAIT_S) for c in self.choices))
            await (wait if request is None else unless_disconnected(request, wait))
            texts = []
            for c in self.choices:
                if c.var.error is not None:
                    raise self.rename(c.var.error)
                assert c.var.value is not None
                texts.append(c.var.value)
            return texts
        finally:
            await self.manager.delete_session(self.session, "closed")

    async def chunks(self, joined: bool, interval: int = 1) -> AsyncIterator[tuple[Choice, str | None]]:
        """(choice, new text) as any choice streams, then (choice, None) once it ends; raises
        ParrotError when one fails. `joined`: chunks of one choice that queued up come as one.
        `interval` (vLLM's `stream_interval`): a choice's text waits for that many new tokens."""
        queue: asyncio.Queue[tuple[Choice, str | None, ParrotError | None]] = asyncio.Queue()

        async def pump(choice: Choice) -> None:
            held: list[str] = []
            num_sent = 0  # the choice's tokens when its text was last sent
            try:
                async for text in choice.var.stream(joined=joined):
                    held.append(text)
                    num_tokens = len(choice.record.output_tokens.get(OUTPUT, ()))
                    if interval <= 1 or num_tokens - num_sent >= interval:
                        num_sent = num_tokens
                        await queue.put((choice, "".join(held), None))
                        held.clear()
                if held:
                    await queue.put((choice, "".join(held), None))
                await queue.put((choice, None, None))
            except ParrotError as e:
                await queue.put((choice, None, self.rename(e)))

        tasks = [asyncio.create_task(pump(c)) for c in self.choices]
        try:
            for _ in range(len(self.choices)):
                while True:
                    choice, text, error = await queue.get()
                    if error is not None:
                        raise error
                    yield choice, text
                    if text is None:
                        break
        finally:
            for t in tasks:
                t.cancel()

    async def close(self) -> None:
        await self.manager.delete_session(self.session, "closed")
