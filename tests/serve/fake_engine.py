"""A small in-memory engine for the manager's unit tests: the engine API's semantics, no model.

Contexts are token lists; a fork copies its parent's tokens. Generation asks `responder(prompt)`
for the text, tokenizes it, and streams it token by token (stop strings and max_tokens honoured),
appending the tokens to the context as the real engine does: a stop string's tokens are sampled,
then cut out (the text before it re-tokenized); the end of the text is an EOS (a last event
without a token); the last event says what the context holds. Every
request is logged with a timestamp so tests can assert on order: an Extend without sampling as
"fill"; one with sampling logs its tokens (if any) as "generate-fill", then "generate". The real
engine replaces it in the integration tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from pathlib import Path

from parrot.protocol.engine_api import (
    EngineStats,
    ExtendRequest,
    Filled,
    FreeContextRequest,
    LeaseRequest,
    TokenEvent,
    check_context_ids,
)
from parrot.protocol.errors import ParrotError
from parrot.protocol.sampling import SamplingParams
from parrot.text import IncrementalDecoder, Tokenizer, cut_to_text


def echo_tail(prompt: str) -> str:
    """Default responder: the prompt's last word, upper-cased."""
    words = prompt.split()
    return " " + (words[-1].upper() if words else "EMPTY")


class FakeEngine:
    def __init__(
        self,
        model_folder: Path,
        responder: Callable[[str], str] = echo_tail,
        token_delay_s: float = 0.0,
        num_blocks: int = 1000,
        block_size: int = 16,
        max_model_len: int = 2048,
    ) -> None:
        self.model_folder = Path(model_folder)
        self.model_name = "fake"
        self.max_model_len = max_model_len
        self.tokenizer = Tokenizer(model_folder)
        self.responder = responder
        self.token_delay_s = token_delay_s
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.contexts: dict[str, list[int]] = {}
        self.busy: set[str] = set()
        self.free_when_idle: set[str] = set()  # freed while generating: freed when it ends
        self.leases: list[LeaseRequest] = []  # every renewal, in order
        self.log: list[tuple[float, str, str, int]] = []  # (time, op, context_id, num_tokens)
        self.fail_generate_when: Callable[[str], bool] = lambda prompt: False

    def _num_used_blocks(self) -> int:
        return sum(math.ceil(len(t) / self.block_size) for t in self.contexts.values())

    def _context(self, context_id: str, parent_context_id: str | None) -> list[int]:
        if parent_context_id is not None:
            if context_id in self.contexts:
                raise ParrotError(f"context {context_id!r} exists", status=409, field="context_id")
            if parent_context_id not in self.contexts:
                raise ParrotError(f"unknown parent {parent_context_id!r}", status=404, field="parent_context_id")
            self.contexts[context_id] = list(self.contexts[parent_context_id])
        return self.contexts.setdefault(context_id, [])

    async def extend(self, req: ExtendRequest) -> AsyncIterator[TokenEvent]:
        if req.sampling is None or req.token_ids:
            await asyncio.sleep(0)  # tokens go in after a turn of the loop, as over a connection
        if req.sampling is None:
            yield TokenEvent(token_id=None, finish_reason="filled", filled=self._fill(req, "fill"))
            return
        filled = self._fill(req, "generate-fill") if req.token_ids else None  # one request, logged in two parts
        if filled is None:
            check_context_ids(self.contexts, req)
        tokens = self._context(req.context_id, None if filled is not None else req.parent_context_id)
        if not tokens:
            raise ParrotError("empty context", field="context_id")
        async with contextlib.aclosing(self._generate(req.context_id, req.sampling, tokens)) as events:
            async for event in events:
                yield event if filled is None else event.model_copy(update={"filled": filled})
                filled = None

    def _fill(self, req: ExtendRequest, op: str) -> Filled:
        check_context_ids(self.contexts, req)
        tokens = self._context(req.context_id, req.parent_context_id)
        if len(tokens) + len(req.token_ids) > self.max_model_len:
            raise ParrotError("too long", field="token_ids")
        tokens.extend(req.token_ids)
        self.log.append((time.monotonic(), op, req.context_id, len(req.token_ids)))
        return Filled(num_tokens=len(tokens), num_filled_tokens=len(req.token_ids))

    async def _generate(
        self, context_id: str, sampling: SamplingParams, tokens: list[int]
    ) -> AsyncGenerator[TokenEvent, None]:
        self.busy.add(context_id)
        self.log.append((time.monotonic(), "generate", context_id, len(tokens)))
        try:
            prompt = self.tokenizer.decode(tokens, skip_special_tokens=False)
            if self.fail_generate_when(prompt):
                yield TokenEvent(token_id=None, finish_reason="error", error="injected failure")
                return
            text = self.responder(prompt)
            ids = self.tokenizer.encode(text)  # the model "samples" the whole text, stop strings too
            hits = sorted((text.index(stop), stop) for stop in sampling.stop if stop in text)
            end, stop_end = (hits[0][0], hits[0][0] + len(hits[0][1])) if hits else (len(text), len(text) + 1)
            decoder = IncrementalDecoder(self.tokenizer)
            start, reported, finish = len(tokens), "", "eos"
            last = TokenEvent(token_id=None)  # the text ran out: an EOS, not in the context
            for i, token_id in enumerate(ids):
                await asyncio.sleep(self.token_delay_s)
                tokens.append(token_id)
                decoder.push(token_id)
                event = TokenEvent(token_id=token_id, text=decoder.text[len(reported) : end])
                reported = decoder.text[:end]
                if len(decoder.text) >= stop_end or i + 1 == sampling.max_tokens:
                    finish, last = "stop" if len(decoder.text) >= stop_end else "length", event
                    break
                yield event
            if finish == "stop":  # as the real engine: the stop's tokens are cut, the text before it re-tokenized
                num_kept, tail = cut_to_text(self.tokenizer, tokens[start:], reported)
                tokens[start + num_kept :] = tail
            yield last.model_copy(update={"finish_reason": finish, "output_token_ids": tokens[start:]})
            self.log.append((time.monotonic(), "generated", context_id, len(tokens) - start))
        finally:
            self.busy.discard(context_id)
            if context_id in self.free_when_idle:
                self._free(context_id)

    async def free(self, req: FreeContextRequest) -> None:
        if req.context_id not in self.contexts:
            raise ParrotError(f"unknown context {req.context_id!r}", status=404, field="context_id")
        if req.context_id in self.free_when_idle:
            raise ParrotError(f"unknown context {req.context_id!r}", status=404, field="context_id")
        self.free_when_idle.add(req.context_id)
        if req.context_id not in self.busy:  # else when its generation ends, as the real engine
            self._free(req.context_id)

    def _free(self, context_id: str) -> None:
        self.free_when_idle.discard(context_id)
        del self.contexts[context_id]
        self.log.append((time.monotonic(), "free", context_id, 0))

    async def renew_lease(self, req: LeaseRequest) -> None:
        self.leases.append(req)

    async def stats(self) -> EngineStats:
        used = self._num_used_blocks()
        return EngineStats(
            model=self.model_name,
            max_model_len=self.max_model_len,
            block_size=self.block_size,
            num_blocks_total=self.num_blocks,
            num_blocks_free=self.num_blocks - used,
            num_contexts=len(self.contexts),
            num_running=len(self.busy),
            num_waiting=0,
            recent_time_per_output_token_ms=0.0,
            num_steps=0,
            num_prefill_tokens=0,
            num_decode_tokens=0,
        )
