"""An engine backed by an OpenAI-compatible completion server (vLLM, or another Parrot manager).

`OpenAIEngineClient` implements the engine API (`EngineClient`) over an upstream's
`/v1/completions`, so the manager schedules onto it like onto a builtin engine: sessions, the DAG,
objective deduction and app-centric placement run here, token generation runs upstream.

Contexts live in the adapter, not upstream: a context is its token id list. An Extend appends its
tokens to it (a fork starts as a copy of its parent's list); without sampling it answers at once:
nothing is computed until an Extend with sampling sends the whole list as a token-id prompt,
streamed, and leaves the sharing of common prefixes to the upstream's automatic prefix caching
(vLLM's APC; Parrot's own prefix sharing of plain requests). Everything is validated before the
context changes. The generated tokens are appended to the context, the EOS that ends a
generation excepted, as the builtin engine does, so a later fork sees them; on a stop-string
finish the stop string's tokens are cut and the text before it re-tokenized (the builtin engine's
contract: the context holds exactly the output's text; the last event's `output_token_ids`).

Tokens come back as ids when the upstream speaks vLLM's dialect (`logprobs: 0` with
`return_tokens_as_token_ids`: each token as "token_id:<n>", with its logprob); Parrot's own
`/v1/completions` does too. Otherwise each streamed chunk's text is re-tokenized with the model's
tokenizer (`tokenizer_folder`), and the events carry no logprob: those ids are usually, not
always, the ones the upstream sampled (a chunk of several tokens, or a character split across
chunks, may tokenize differently), so a later fork may continue from a slightly different
sequence than the upstream's own.

Events follow the builtin engine's (one per token; `text` what it completes; the last has the
finish reason, "eos" told from "stop" by the model's EOS ids), except that a finish arriving in a
chunk of its own (Parrot's own server sends one) comes as a last event without a token. Work on a
context waits for a generation streaming into it, as the builtin engine queues it. An Extend's
objective and priority travel as vLLM's request `priority` (openai_dialect.upstream_priority;
served in that order under `--scheduling-policy priority`); an upstream that refuses the field
gets the request again without it, and no priority from then on (`send_priority`). Sampling
settings go upstream as OpenAI's fields (penalties, `logit_bias`) or vLLM's (`repetition_penalty`,
`structured_outputs` for regex / JSON schema / choices, `logprobs` k for `top_logprobs`); what
cannot be asked is a 400 (openai_dialect.completion_body), never dropped. Not forwarded: a
choice's score (`choice_logprobs`: the upstream does not report it; the engine API allows its
absence).

The stats are what the adapter knows: its contexts and running generations, tokens streamed,
prompt tokens the upstream reported computing (usage minus cached), time between streamed tokens.
Its "KV blocks" count the token lists it holds against `max_held_tokens` (the manager's prefix
eviction reads them), not the upstream's KV cache. Its step profile is learned from the time per
output token each stream shows at each number of concurrent generations (tpot_profile.py), so the
manager calibrates its latency cap for the upstream as for a builtin engine: from measurements,
not a fixed number. `stats()` asks the upstream for its models, so the manager's heartbeats find
a dead upstream (an unreachable one raises EngineUnavailable), unless a stream brought a token
within the last `HEARD_S` and nothing failed to reach the upstream since its last answered GET:
that is as good a sign of life, and under load the heartbeat's request would only take CPU from
the upstream's cores (0.9 ms here and ~0.7 ms in vLLM's API server, twice a second at the
manager's default interval).

Owned by one asyncio event loop (the manager's): no locks. `snapshot()` may be read from another
thread (benchmarks): it reads counters only.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parrot.backends.openai_dialect import (
    StopRule,
    completion_body,
    eos_token_ids,
    upstream_priority,
)
from parrot.backends.openai_stream import UpstreamStreams
from parrot.protocol.engine_api import (
    ContextInfo,
    EngineStats,
    ExtendRequest,
    Filled,
    FreeContextRequest,
    LeaseRequest,
    TokenEvent,
    check_context_ids,
)
from parrot.protocol.errors import ParrotError, not_found
from parrot.text import Tokenizer, cut_to_text

BLOCK_SIZE = 16  # of the adapter's own token bookkeeping (see the module docstring)
# Tokens per streamed chunk asked of a vLLM upstream for a generation nobody watches
# (ExtendRequest.watched): one chunk per token cost vLLM ~8% and the manager most of its CPU per
# request on GPTs-like traffic (`benchmarks.serving.vllm_paths`); a reader that comes later sees bursts.
UNWATCHED_STREAM_INTERVAL = 16
# A token streamed this recently stands for a heartbeat's answer (the manager's default interval).
HEARD_S = 0.5


@dataclass
class _Context:
    token_ids: list[int]  # the parent's (copied at the fork), then its own
    parent_id: str | None = None
    generating: bool = False
    free_when_idle: bool = False  # freed while generating: dropped when the generation ends
    idle: asyncio.Event = field(default_factory=asyncio.Event)  # set while not generating

    def __post_init__(self) -> None:
        self.idle.set()


class OpenAIEngineClient:
    """The engine API over an upstream's `/v1/completions` (see the module docstring).

    `base_url`: the server's root (a trailing `/v1` is accepted). `model`: the upstream's model
    name (default: the first it lists). `tokenizer_folder`: a local Hugging Face folder of the
    same model, for the manager's tokenizer, EOS detection and the re-tokenizing fallback (default:
    the upstream model card's `root`, when that is a folder here). `max_model_len`: default the
    upstream model card's (vLLM reports it). `ask_token_ids=False` sends plain OpenAI requests
    (for servers that refuse unknown fields); tokens are then always re-tokenized.
    `send_priority=False` never sends `priority` (else it stops at the first refusal).
    `stream_interval` > 1 asks a vLLM upstream for that many tokens per streamed chunk: on a
    2-core machine per-token streaming costs vLLM ~9% (`benchmarks.serving.vllm_paths`, its whole
    and streamed modes); a reader of the output then sees its text in bursts.
    """

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        tokenizer_folder: str | Path | None = None,
        max_model_len: int | None = None,
        *,
        ask_token_ids: bool = True,
        send_priority: bool = True,
        max_held_tokens: int = 1 << 22,
        timeout_s: float = 600.0,
        stream_interval: int = 1,
    ) -> None:
        base = base_url.rstrip("/")
        self.stream_interval = stream_interval  # tokens per streamed chunk asked of a vLLM upstream
        self.base_url = base[: -len("/v1")] if base.endswith("/v1") else base
        self.model_folder: Path | None = None if tokenizer_folder is None else Path(tokenizer_folder)
        self._model = model
        self._max_model_len = max_model_len
        self.ask_token_ids = ask_token_ids
        self.max_held_tokens = max_held_tokens
        self._upstream = UpstreamStreams(self.base_url, api_key, timeout_s, send_priority)
        self._info: dict[str, Any] | None = None
        self._tokenizer: Tokenizer | None = None
        self._eos_ids: frozenset[int] = frozenset()
        self._contexts: dict[str, _Context] = {}
        self._num_held_tokens = 0

    async def aclose(self) -> None:
        await self._upstream.aclose()

    # ---- what the upstream serves -----------------------------------------------------------------
    async def info(self) -> dict[str, Any]:
        """{"model", "model_folder", "max_model_len"}: from `GET /v1/models` once, then cached."""
        if self._info is None:
            self._info = self._read_model_card(await self._upstream.get("/v1/models"))
            if self.model_folder is not None:  # loading a tokenizer takes ~0.1 s: off the event loop
                self._tokenizer = await asyncio.to_thread(Tokenizer, self.model_folder)
                self._eos_ids = eos_token_ids(self.model_folder, self._tokenizer.eos_token_id)
        return dict(self._info)

    def _read_model_card(self, listing: Any) -> dict[str, Any]:
        cards = [c for c in (listing.get("data") if isinstance(listing, dict) else None) or [] if isinstance(c, dict)]
        served = [str(c.get("id")) for c in cards]
        if not cards:
            raise ParrotError(f"the upstream {self.base_url} lists no model", field="model")
        if self._model is not None and self._model not in served:
            raise ParrotError(f"the upstream serves {served}, not {self._model!r}", status=404, field="model")
        card = cards[served.index(self._model)] if self._model is not None else cards[0]
        max_model_len = self._max_model_len or card.get("max_model_len")
        if not isinstance(max_model_len, int) or max_model_len < 1:
            raise ParrotError(
                f"the upstream's model card has no max_model_len: configure it ({card})", field="max_model_len"
            )
        root = card.get("root")
        if self.model_folder is None and isinstance(root, str) and (Path(root) / "tokenizer.json").is_file():
            self.model_folder = Path(root)
        model = str(card.get("id"))
        return {"model": model, "model_folder": self.model_folder, "max_model_len": max_model_len}

    async def stats(self) -> EngineStats:
        """Checks that the upstream answers (a heartbeat; a token streamed within `HEARD_S` is
        one, unless a request failed to reach it since it last answered), then the adapter's own
        counters."""
        if self._info is None:
            await self.info()
        elif self._upstream.doubted or time.perf_counter() - self._upstream.heard_at >= HEARD_S:
            await self._upstream.get("/v1/models")
        return self.snapshot()

    def snapshot(self) -> EngineStats:
        """The adapter's counters, without asking the upstream (any thread; after `info()`)."""
        info = self._info or {"model": self._model or "", "max_model_len": self._max_model_len or 0}
        upstream = self._upstream
        num_blocks_total = max(1, self.max_held_tokens // BLOCK_SIZE)
        return EngineStats(
            model=info["model"],
            max_model_len=info["max_model_len"],
            block_size=BLOCK_SIZE,
            num_blocks_total=num_blocks_total,
            num_blocks_free=max(0, num_blocks_total - math.ceil(self._num_held_tokens / BLOCK_SIZE)),
            num_contexts=len(self._contexts),
            num_running=upstream.num_running,
            num_waiting=0,
            recent_time_per_output_token_ms=upstream.tpot_ms,
            num_steps=0,
            num_prefill_tokens=upstream.num_prefill_tokens,
            num_decode_tokens=upstream.num_decode_tokens,
            num_reused_tokens=upstream.num_reused_tokens,
            step_ms_by_num_tokens=upstream.profile.as_dict(),
        )

    # ---- the engine API ---------------------------------------------------------------------------
    async def extend(self, req: ExtendRequest) -> AsyncIterator[TokenEvent]:
        if req.score:
            raise ParrotError("this engine cannot score tokens: its upstream reports no prompt logprobs", field="score")
        info = await self.info()
        await self._settle(req.context_id, req.parent_context_id)  # no await until the context changes
        bad = next((t for t in req.token_ids if t < 0), None)
        if bad is not None:  # larger ids are the upstream's to refuse: it knows the model's vocabulary
            raise ParrotError(f"token id {bad} is negative", field="token_ids")
        check_context_ids(self._contexts, req)
        source = self._contexts.get(req.parent_context_id or req.context_id)
        num_tokens = (len(source.token_ids) if source is not None else 0) + len(req.token_ids)
        if num_tokens > info["max_model_len"]:
            raise ParrotError(
                f"context would hold {num_tokens} tokens; the model's limit is {info['max_model_len']}",
                field="token_ids",
            )
        filled = Filled(num_tokens=num_tokens, num_filled_tokens=len(req.token_ids))
        if req.sampling is None:
            self._append(req)
            yield TokenEvent(token_id=None, finish_reason="filled", filled=filled)
            return
        if num_tokens == 0 or num_tokens >= info["max_model_len"]:
            what = "is empty" if num_tokens == 0 else f"holds the model's limit of {info['max_model_len']} tokens"
            raise ParrotError(f"context {req.context_id!r} {what}: nothing to generate from", field="context_id")
        sampling = req.sampling
        priority = upstream_priority(req.objective, req.priority) if self._upstream.send_priority else 0
        interval = self.stream_interval
        if not req.watched and self.ask_token_ids:  # vLLM's dialect: chunks of several tokens
            interval = max(interval, UNWATCHED_STREAM_INTERVAL)
        body = completion_body(  # refuses what the upstream cannot be asked before the context changes
            info["model"],
            [*(source.token_ids if source is not None else ()), *req.token_ids],
            sampling,
            min(sampling.max_tokens, info["max_model_len"] - num_tokens),
            self.ask_token_ids,
            priority,
            interval,
            req.logprobs or not self._upstream.ids_without_logprobs,
        )
        ctx = self._append(req)
        is_new = req.parent_context_id is not None and not req.token_ids  # a fork to generate in, no more
        rule = StopRule(self._eos_ids, sampling.ignore_eos)
        retokenize = self._tokenizer.encode if self._tokenizer is not None else None
        ctx.generating = True
        ctx.idle.clear()
        num_events, start, texts = 0, len(ctx.token_ids), []
        try:
            # Closed explicitly, so an early close here drops the upstream request at once (vLLM aborts it).
            async with contextlib.aclosing(self._upstream.stream(body, rule, retokenize, len(ctx.token_ids))) as events:
                async for event in events:
                    if event.token_id is not None and event.finish_reason != "eos":  # EOS stays out of the context
                        ctx.token_ids.append(event.token_id)
                        self._num_held_tokens += 1
                    texts.append(event.text)
                    if num_events == 0 and req.token_ids:  # the first event says what they did
                        event = event.model_copy(update={"filled": filled})
                    num_events += 1
                    if event.finish_reason is not None:
                        event = self._settle_output(event, ctx, start, "".join(texts))
                    yield event
        except BaseException:
            if is_new and num_events == 0:
                self._drop(req.context_id)  # a fork that produced nothing leaves nothing behind
            raise
        finally:
            ctx.generating = False
            ctx.idle.set()
            if ctx.free_when_idle:
                self._drop(req.context_id)

    def _append(self, req: ExtendRequest) -> _Context:
        """The request's context (created, or forked: a copy of its parent's tokens) with its
        tokens appended; the ids are checked."""
        ctx = self._open(req.context_id, req.parent_context_id)
        ctx.token_ids.extend(req.token_ids)
        self._num_held_tokens += len(req.token_ids)
        return ctx

    def _settle_output(self, last: TokenEvent, ctx: _Context, start: int, text: str) -> TokenEvent:
        """The last event, saying what the context holds: on a stop-string finish the upstream
        streamed the stop string's tokens but not its text, so they are cut and the text before it
        in the first cut token is re-tokenized (as the builtin engine does; needs the tokenizer)."""
        if last.finish_reason == "stop" and self._tokenizer is not None:
            num_kept, tail = cut_to_text(self._tokenizer, ctx.token_ids[start:], text)
            self._num_held_tokens += start + num_kept + len(tail) - len(ctx.token_ids)
            ctx.token_ids[start + num_kept :] = tail
        return last.model_copy(update={"output_token_ids": ctx.token_ids[start:]})

    async def renew_lease(self, req: LeaseRequest) -> None:
        """Nothing to hold: the contexts live here, in the manager's process, and die with it."""

    async def free(self, req: FreeContextRequest) -> None:
        """As the builtin engine: a context that is generating is freed when its generation ends."""
        ctx = self._contexts.get(req.context_id)
        if ctx is None or ctx.free_when_idle:
            raise not_found("context", req.context_id, "context_id")
        if ctx.generating:
            ctx.free_when_idle = True
            return
        self._drop(req.context_id)

    def context_info(self, context_id: str) -> ContextInfo:
        """A context's length (its blocks: the adapter's bookkeeping of its token list)."""
        ctx = self._contexts.get(context_id)
        if ctx is None:
            raise not_found("context", context_id, "context_id")
        num_tokens = len(ctx.token_ids)
        return ContextInfo(
            context_id=context_id,
            parent_context_id=ctx.parent_id,
            num_tokens=num_tokens,
            num_blocks=math.ceil(num_tokens / BLOCK_SIZE),
        )

    # ---- helpers ----------------------------------------------------------------------------------
    async def _settle(self, context_id: str, parent_id: str | None) -> None:
        """Work on a context waits for the generation streaming into it (and a fork for its parent's)."""
        for cid in (context_id, parent_id):
            while cid is not None and (ctx := self._contexts.get(cid)) is not None and ctx.generating:
                await ctx.idle.wait()

    def _open(self, context_id: str, parent_id: str | None) -> _Context:
        """The context, created empty or as a copy of its parent's tokens (ids checked)."""
        ctx = self._contexts.get(context_id)
        if ctx is None:
            tokens = list(self._contexts[parent_id].token_ids) if parent_id is not None else []
            ctx = self._contexts[context_id] = _Context(tokens, parent_id)
            self._num_held_tokens += len(tokens)
        return ctx

    def _drop(self, context_id: str) -> None:
        ctx = self._contexts.pop(context_id, None)
        if ctx is not None:
            self._num_held_tokens -= len(ctx.token_ids)
