"""One OpenAI-compatible upstream's HTTP side, for the engine adapter (openai_engine.py).

`UpstreamStreams` owns the HTTP client: GETs (model card, heartbeat) and streamed completions
turned into engine-API events (openai_dialect.py), with what they tell about the upstream: tokens
streamed, prompt tokens it computed or had cached, running generations, and the time between a
stream's tokens (its recent mean, and the profile by concurrency that the manager calibrates its
latency cap from: tpot_profile.py). A request's `priority` that the upstream refuses (vLLM without
`--scheduling-policy priority`) is dropped and the request sent again; no priority is sent after.
`heard_at` is when the upstream last streamed a token (a stream in progress is proof of life, as
a heartbeat's answer is); `doubted` is set by a failure to reach it (a refused connection, a stream
cut short) and cleared only by an answered GET: an upstream that refuses new requests while its
open streams run on (a server shutting down) is not alive for the tokens those streams bring.

Owned by one asyncio event loop (the adapter's); the counters may be read from another thread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

import aiohttp

from parrot.backends.http_client import TRANSPORT_ERRORS, LazyClient
from parrot.backends.openai_dialect import (
    StopRule,
    choice_events,
    error_status,
    prompt_usage,
    refuses_field,
    refuses_priority,
    sse_chunks,
    upstream_error,
    with_logprobs_ids,
)
from parrot.backends.tpot_profile import TpotProfile
from parrot.protocol.engine_api import TokenEvent
from parrot.protocol.engine_client import EngineUnavailable
from parrot.protocol.framing import text_lines

log = logging.getLogger(__name__)


class UpstreamStreams:
    def __init__(self, base_url: str, api_key: str | None, timeout_s: float, send_priority: bool) -> None:
        self.base_url = base_url
        self.send_priority = send_priority
        self.ids_without_logprobs = True  # vLLM's `return_token_ids` (False once the upstream refused it)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self._http = LazyClient(base_url, timeout_s, headers)
        self.num_running = 0  # streams open
        self.num_prefill_tokens = 0
        self.num_decode_tokens = 0
        self.num_reused_tokens = 0  # the upstream's cached prompt tokens, as its usage reports them
        self.tpot_ms = 0.0
        self.profile = TpotProfile()  # the upstream's decode step by concurrent generations
        self.heard_at = -math.inf  # time.perf_counter() of the last streamed token
        self.doubted = False  # unreachable since the last answered GET

    async def aclose(self) -> None:
        await self._http.aclose()

    async def stream(
        self, body: dict[str, Any], rule: StopRule, retokenize: Callable[[str], list[int]] | None, prompt_len: int
    ) -> AsyncGenerator[TokenEvent, None]:
        """The upstream's streamed completion as events. The finishing event waits for the end of the
        stream (the usage chunk and `[DONE]` follow at once), so the connection is reused."""
        self.num_running += 1
        try:
            async with contextlib.aclosing(self._events(body, rule, retokenize, prompt_len)) as events:
                async for event in events:
                    yield event
        finally:
            self.num_running -= 1

    async def _events(
        self, body: dict[str, Any], rule: StopRule, retokenize: Callable[[str], list[int]] | None, prompt_len: int
    ) -> AsyncGenerator[TokenEvent, None]:
        finished: TokenEvent | None = None
        usage: dict[str, Any] | None = None  # the last reported (some servers report it on every chunk)
        started = False
        last_token_at: float | None = None
        num_top = int(body.get("logprobs") or 0)  # alternatives asked for (ids only)
        try:
            async with self._completion(body) as resp:
                async for chunk in sse_chunks(text_lines(resp.content.iter_any()), self.base_url):
                    if isinstance(chunk.get("usage"), dict):
                        usage = chunk["usage"]
                    if finished is not None:
                        continue
                    if chunk.get("error") is not None:
                        failure = upstream_error(self.base_url, error_status(chunk), json.dumps(chunk))
                        if not started:
                            raise failure  # nothing produced: the caller sees the status
                        finished = TokenEvent(token_id=None, finish_reason="error", error=failure.message)
                        continue
                    choices = [c for c in chunk.get("choices") or [] if isinstance(c, dict) and c.get("index", 0) == 0]
                    events = [e for c in choices for e in choice_events(c, retokenize, rule, num_top)]
                    num_tokens = sum(e.token_id is not None for e in events)
                    if num_tokens:
                        last_token_at = self._observe_tokens(num_tokens, last_token_at)
                    for event in events:
                        if event.finish_reason is not None:
                            finished = event
                            break
                        started = True
                        yield event
        except TRANSPORT_ERRORS as e:
            self.doubted = True
            raise self._http.unavailable(e) from e
        num_computed, num_cached = prompt_usage(usage, prompt_len)
        self.num_prefill_tokens += num_computed
        self.num_reused_tokens += num_cached
        if finished is None:
            self.doubted = True
            raise EngineUnavailable(f"the upstream {self.base_url} ended a stream without a finish reason")
        yield finished

    def _observe_tokens(self, num_tokens: int, last_token_at: float | None) -> float:
        """`num_tokens` of one stream arrived now: the gap since its previous token (the first has
        none: its time is the prompt's) is a time per output token at the current concurrency."""
        now = time.perf_counter()
        if last_token_at is not None:
            gap_ms = 1000.0 * (now - last_token_at)
            self.profile.observe(self.num_running, gap_ms, num_tokens)
            ms = gap_ms / num_tokens
            self.tpot_ms = ms if self.tpot_ms == 0 else 0.8 * self.tpot_ms + 0.2 * ms
        self.num_decode_tokens += num_tokens
        self.heard_at = now
        return now

    @contextlib.asynccontextmanager
    async def _completion(self, body: dict[str, Any]) -> AsyncIterator[aiohttp.ClientResponse]:
        """The upstream's streamed answer to `body`, once it said yes. An upstream that refuses the
        `priority` field (vLLM without priority scheduling) is asked again without it, and is sent
        none from then on; one that refuses `return_token_ids` is asked for the ids under
        `logprobs: 0` instead, from then on too; any other refusal is the upstream's error."""
        async with self._http.session().post(f"{self.base_url}/v1/completions", json=body) as resp:
            if resp.status < 400:
                yield resp
                return
            text = (await resp.read()).decode(errors="replace")
        if refuses_field("return_token_ids", body, resp.status, text):
            if self.ids_without_logprobs:
                log.info("upstream %s refuses return_token_ids; asking logprobs: 0 instead", self.base_url)
                self.ids_without_logprobs = False
            async with self._completion(with_logprobs_ids(body)) as resp:
                yield resp
            return
        if not refuses_priority(body, resp.status, text):
            raise upstream_error(self.base_url, resp.status, text)
        if self.send_priority:
            log.warning("upstream %s refuses request priorities; not sending them: %s", self.base_url, text[:200])
            self.send_priority = False
        async with self._completion({k: v for k, v in body.items() if k != "priority"}) as resp:
            yield resp

    async def get(self, path: str) -> Any:
        try:
            async with self._http.session().get(f"{self.base_url}{path}") as resp:
                text = (await resp.read()).decode(errors="replace")
        except TRANSPORT_ERRORS as e:
            self.doubted = True
            raise self._http.unavailable(e) from e
        self.doubted = False
        if resp.status >= 400:
            raise upstream_error(self.base_url, resp.status, text)
        return json.loads(text)
