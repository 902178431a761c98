"""Runs one semantic call on its engine through the engine API.

A call owns one engine context, `<session_id>.<call_id>` (`.r<n>` on its n-th re-dispatch). Its
prompt's tokens are the rendered prompt's (render.py): an early fill may put the stable tokens of
the ready prefix there before the call's last inputs arrive; `run` fills the rest up to the first
output (starting the context over, should the early tokens not be a prefix of the prompt's),
generates it, fills the text up to the next output (tokenized on its own), generates that, and so
on (the engine leaves exactly the output's text in the context, a stop string cut out, so later
text continues right after it). Each output variable is set the moment its generation ends, so
its consumers can start while this call still generates its later outputs.

With prefix sharing, the context's first fill forks from a cached prefix context leased from
`PrefixContexts` (held until the runner is freed), and an early fill only warms cached prefixes:
the call's own context waits for the dispatch, so calls that share what follows the ready prefix
can still share it. Every Extend carries the call's deduced objective and priority.

While the call runs, the fill right before a generation is held (`pending`) and sent as the tokens
of the generation's Extend (appended, or after the leased prefix as parent): one request, and the
builtin engine samples the output's first token in the fill's last step. Its usage is recorded
when the engine's first event arrives, as a fill's is when its `filled` event does; a fill another
fill follows is sent as an Extend without sampling first.

A re-run after an engine died resumes: outputs set before are filled back as their generated
tokens, and an output cut off mid-generation continues from its tokens so far (never repeated,
never lost).

Owned by the executor, which serializes a runner's steps (one in flight at a time). The runner
writes the call's usage and output tokens into the call's run record (call_run.py) and reads the
objective deduced for it there before each request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Protocol

from parrot.protocol.engine_api import ExtendRequest, Filled
from parrot.protocol.engine_client import EngineUnavailable, extend_only
from parrot.protocol.errors import ParrotError
from parrot.protocol.objective import Objective
from parrot.serve.clock import REAL_CLOCK, Clock
from parrot.serve.policy.prefix import PrefixPoint
from parrot.serve.runtime.contexts import Lease, PrefixContexts, free_engine_context, prompt_points
from parrot.serve.runtime.engines import EngineHandle
from parrot.serve.runtime.graph import CallNode
from parrot.serve.runtime.render import check_prompt_len, render_prompt, segment_token_ids, stages
from parrot.serve.runtime.scoring import StreamedToken, score_options, score_prompt, scored_tokens
from parrot.serve.runtime.variable import Variable

log = logging.getLogger(__name__)


class RunRecord(Protocol):
    """What a runner reads and writes of its call's run record. It is call_run.CallRun, declared
    here by its fields because the record holds its runner (call_run imports this module)."""

    objective: Objective
    num_attempts: int
    num_prompt_tokens: int
    num_cached_tokens: int
    num_early_filled_tokens: int
    num_generated_tokens: int
    first_token_at: float | None
    prefix_source: str | None
    finish_reasons: dict[str, str]
    output_token_ids: dict[str, list[int]]
    output_tokens: dict[str, list[StreamedToken]]
    prompt_tokens: list[StreamedToken] | None

    @property
    def engine_priority(self) -> int: ...


class CallRunner:
    def __init__(
        self,
        session_id: str,
        call: CallNode,
        run: RunRecord,
        variables: Mapping[str, Variable],
        engine: EngineHandle,
        on_output_set: Callable[[Variable], None],
        prefixes: PrefixContexts | None = None,
        clock: Clock = REAL_CLOCK,
    ) -> None:
        self.call, self.clock = call, clock
        self.record = run
        self.variables = variables
        self.engine = engine
        suffix = f".r{run.num_attempts}" if run.num_attempts else ""
        self.context_id = f"{session_id}.{call.call_id}{suffix}"
        self.on_output_set = on_output_set
        self.prefixes = prefixes
        self.lease: Lease | None = None  # the cached prefix our context forks (or will fork) from
        self.running = False  # set by `run`; before it, fills are early fills
        self.has_context = False  # a fill was sent: the engine may hold the context
        self.num_filled_pieces = 0  # leading pieces whose prompt tokens are filled (or warmed)
        self.prompt_ids: list[int] = []  # the prompt tokens our context holds (before any output)
        self.counts_as_early_filled = False  # the executor's early-fill bookkeeping on the engine
        self.task: asyncio.Task[None] | None = None  # the executor's task now working for it
        self.engine_lost = False  # its engine died: the executor starts the call over
        # While running, the fill right before a generation travels in the generation's Extend:
        # held here with what to record once the engine took it (sent alone if another fill comes).
        self.pending: tuple[ExtendRequest, Callable[[Filled | None], None]] | None = None

    async def rebind(self, engine: EngineHandle) -> None:
        """Run on another engine than the early fill's: what was filled there is given up."""
        await self.free()
        self.num_filled_pieces = 0
        self.engine = engine
        self.engine_lost = False

    async def fill_to(self, stop: int) -> None:
        """Fill the prompt of pieces[:stop] (all known; stop <= the first output): all of it when
        `stop` is the first output, else its stable tokens (render.render_prompt)."""
        if stop <= self.num_filled_pieces:
            return
        tokenizer = self.engine.tokenizer
        points: tuple[PrefixPoint, ...] = ()
        if self.prefixes is None:
            token_ids = render_prompt(self.call, self.variables, tokenizer, stop).token_ids
        else:
            block_tokens = self.prefixes.config.sharing.prefix_block_tokens
            token_ids, points = prompt_points(self.call, self.variables, tokenizer, stop, block_tokens)
        if self.has_context and token_ids[: len(self.prompt_ids)] != self.prompt_ids:
            # What an earlier fill put in our context is not a prefix of the prompt's tokens (the
            # stable rule should prevent it): never generate from wrong tokens, start the context over.
            log.warning("call %s: refilling its prompt: the tokens filled early changed", self.call.call_id)
            # Our fills have ended (awaited) and no generation ran on it: the engine frees it at
            # once, so the same id can be filled again.
            await free_engine_context(self.engine.client, self.context_id)
            self.has_context = False
            self.record.num_prompt_tokens -= len(self.prompt_ids)  # counted again when refilled
            self.prompt_ids = []
        if not self.has_context and self.prefixes is not None:
            await self._first_fill(self.prefixes, stop, token_ids, points)
            return

        def filled() -> None:
            self.prompt_ids = token_ids
            self.num_filled_pieces = stop

        await self._fill_tokens(token_ids[len(self.prompt_ids) :], filled)

    async def _first_fill(
        self, prefixes: PrefixContexts, stop: int, token_ids: list[int], points: tuple[PrefixPoint, ...]
    ) -> None:
        """Fork our context from the longest cached prefix (creating the ones worth caching)."""
        early = not self.running
        lease = await prefixes.lease(
            self.engine,
            self.call,
            token_ids,
            points,
            early,
            self.record.objective,
            self.record.engine_priority,
            owner=self.context_id,
        )
        # A lease from an earlier (early) fill is kept only while it is still a prefix of ours; when
        # it is, the new lease holds it or a longer one.
        self._drop_lease()
        self.lease = lease
        if early and (self.lease is not None or (points and prefixes.cache.num_sharers(points[-1].prefix_hash) > 1)):
            return  # warmed (or siblings share this prefix and may share what follows): wait
        parent = self.lease.entry if self.lease is not None else None
        if parent is None and not token_ids:
            self.num_filled_pieces = stop
            return
        num_parent_tokens = parent.num_tokens if parent is not None else 0
        req = ExtendRequest(
            context_id=self.context_id,
            token_ids=token_ids[num_parent_tokens:],
            parent_context_id=None if parent is None else parent.context_id,
            objective=self.record.objective,
            priority=self.record.engine_priority,
        )

        def filled(result: Filled | None) -> None:
            self.prompt_ids = token_ids
            self.record.num_prompt_tokens += len(token_ids)
            if self.lease is not None:
                # Reused by our fork: what other calls computed, and what our own early fill did.
                others, own_early = self.lease.reuse(self.context_id)
                self.record.num_cached_tokens = others
                kinds = [p.kind for p in points if p.num_tokens == self.lease.entry.num_tokens]
                self.record.prefix_source = kinds[0].value if kinds else None
                self.record.num_early_filled_tokens += own_early
            if early and result is not None:
                self.record.num_early_filled_tokens += result.num_filled_tokens
            self.num_filled_pieces = stop

        await self._fill(req, filled)

    async def _fill_scored(self, stop: int, top: int) -> None:
        """The prompt up to the first output as one scoring fill of a context of its own (every
        token computed, so each gets its logprob: no cached prefix, nothing filled early kept)."""
        if self.has_context:
            await free_engine_context(self.engine.client, self.context_id)
            self.has_context, self.prompt_ids, self.record.num_prompt_tokens = False, [], 0
        self._drop_lease()
        token_ids = render_prompt(self.call, self.variables, self.engine.tokenizer, stop).token_ids
        if not token_ids:
            return
        self.has_context = True
        objective, priority = self.record.objective, self.record.engine_priority
        self.record.prompt_tokens = await score_prompt(
            self.engine.client, self.context_id, token_ids, top, objective, priority
        )
        self.record.num_prompt_tokens += len(token_ids)
        self.prompt_ids, self.num_filled_pieces = token_ids, stop

    async def _fill_tokens(self, token_ids: list[int], then: Callable[[], None] | None = None) -> None:
        if not token_ids:
            if then is not None:
                then()
            return
        req = ExtendRequest(
            context_id=self.context_id,
            token_ids=token_ids,
            append=self.has_context,  # our context exists: extend it; else create it
            objective=self.record.objective,
            priority=self.record.engine_priority,
        )

        def filled(result: Filled | None) -> None:
            self.record.num_prompt_tokens += len(token_ids)
            if not self.running and result is not None:
                self.record.num_early_filled_tokens += result.num_filled_tokens
            if then is not None:
                then()

        await self._fill(req, filled)

    async def _fill(self, req: ExtendRequest, filled: Callable[[Filled | None], None]) -> None:
        """Send a fill, or while running hold it for the generation that follows (`_generate`
        sends its tokens in the generation's Extend); `filled` records it once the engine took it."""
        self.has_context = True  # before any await: the engine may create it even if we are cancelled
        if self.running:
            await self._flush()
            self.pending = (req, filled)
            return
        filled(await extend_only(self.engine.client, req))

    async def _flush(self) -> None:
        """Send the held fill as an Extend of its own (no generation follows it right away)."""
        if self.pending is not None:
            req, filled = self.pending
            self.pending = None
            filled(await extend_only(self.engine.client, req))

    async def run(self) -> None:
        """Fill and generate every output; raises ParrotError (outputs not yet set stay unset)."""
        self.running = True
        check_prompt_len(self.call, self.variables, self.engine.tokenizer, self.engine.max_model_len, field="prompt")
        tokenizer = self.engine.tokenizer
        for i, (start, stop, name) in enumerate(stages(self.call.template)):
            if i == 0 and (top := self.call.sampling[name].prompt_logprobs) is not None:
                await self._fill_scored(stop, top)
            elif i == 0:
                await self.fill_to(stop)
            else:  # the text after an output, tokenized on its own (render.py)
                await self._fill_tokens(segment_token_ids(self.call, self.variables, tokenizer, start, stop))
            if not self.has_context:
                raise ParrotError(f"the prompt before output {name!r} is empty", field="template")
            var = self.variables[self.call.outputs[name]]
            if var.value is not None and name in self.record.finish_reasons:
                await self._fill_tokens(self.record.output_token_ids[name])  # set by an earlier run
            elif not (self.call.sampling[name].score_choices and await self._select(name, var)):
                await self._generate(name, var)  # (an engine that cannot score: the choices grammar)
            self.num_filled_pieces = stop + 1  # the generated tokens are in the context
        await self._flush()  # a resumed last output's tokens, filled back

    async def _select(self, name: str, var: Variable) -> bool:
        """Score each choice (tokenized on its own) as a fork of the context, in one batch of
        scoring fills; the most likely one (the first on a tie) goes into the context and sets the
        output, with every choice's score. False, changing nothing, when the engine cannot score."""
        choices = self.call.sampling[name].choices or []
        await self._flush()  # the prompt is in the context: the forks read it
        token_ids = self.engine.tokenizer.encode_batch(choices)
        objective, priority = self.record.objective, self.record.engine_priority
        results = await score_options(self.engine.client, self.context_id, token_ids, objective, priority)
        if results is None:
            return False
        scores = [sum(x or 0.0 for x in r.token_logprobs or ()) for r in results]
        best = max(range(len(choices)), key=lambda i: (scores[i], -i))
        chosen = token_ids[best]
        req = ExtendRequest(
            context_id=self.context_id, token_ids=chosen, append=True, objective=objective, priority=priority
        )
        await self._fill(req, lambda _: None)  # the chosen tokens follow the prompt, as generated ones would
        self.record.output_token_ids[name] = list(chosen)
        self.record.output_tokens[name] = scored_tokens(chosen, results[best])
        var.scores = dict(zip(choices, scores, strict=True))
        var.append(choices[best])
        self._set_output(name, var, "stop")
        return True

    async def _generate(self, name: str, var: Variable) -> None:
        sampling = self.call.sampling[name]
        generated = self.record.output_token_ids.setdefault(name, [])
        streamed = self.record.output_tokens.setdefault(name, [])
        if generated:  # an earlier run was cut off: continue after its tokens
            await self._fill_tokens(generated)
            self._append_held_back_text(var, generated)
            if len(generated) >= sampling.max_tokens:
                self._set_output(name, var, "length")
                return
            sampling = sampling.model_copy(update={"max_tokens": sampling.max_tokens - len(generated)})
        fill, filled = self.pending or (None, None)  # the fill before it travels with it: one request
        self.pending = None
        events = self.engine.client.extend(
            ExtendRequest(
                context_id=self.context_id,
                sampling=sampling,
                parent_context_id=fill.parent_context_id if fill is not None else None,
                token_ids=fill.token_ids if fill is not None else [],
                append=fill.append if fill is not None else True,
                objective=self.record.objective,
                priority=self.record.engine_priority,
                watched=var.watched,
                logprobs=var.logprobs_read,
            )
        )
        finish_reason: str | None = None
        num_before = len(generated)  # an earlier run's tokens, filled back above
        try:
            async for event in events:
                if filled is not None:  # the engine took the tokens
                    filled(event.filled)
                    filled = None
                if event.token_id is not None:
                    if event.finish_reason != "eos":  # the engine keeps EOS out of the context
                        generated.append(event.token_id)
                    streamed.append((event.token_id, event.logprob, event.top_logprobs))
                    self.record.num_generated_tokens += 1
                    if self.record.first_token_at is None:
                        self.record.first_token_at = self.clock.now()
                if event.text:
                    var.append(event.text)
                if event.finish_reason is not None:
                    finish_reason = event.finish_reason
                    if event.output_token_ids is not None:  # what the context holds (a stop string cut out)
                        generated[num_before:] = event.output_token_ids
                    if finish_reason == "error":
                        raise ParrotError(f"engine error while generating {name!r}: {event.error}", status=500)
                    if finish_reason == "aborted":
                        raise ParrotError(f"the engine aborted the generation of {name!r}", status=503)
                    break
        finally:
            # Closing the stream early (cancellation, error) tells the engine to abort.
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                await aclose()
        if finish_reason is None:
            raise EngineUnavailable(f"the engine's stream for {name!r} ended without a finish reason")
        self._set_output(name, var, finish_reason)

    def _set_output(self, name: str, var: Variable, finish_reason: str) -> None:
        self.record.finish_reasons[name] = finish_reason
        if not var.is_done:  # a deleted session failed it already
            var.set("".join(var.chunks))  # exactly the text streamed, across runs
            self.on_output_set(var)

    def _append_held_back_text(self, var: Variable, generated: list[int]) -> None:
        # The engine holds text back while a stop string may be forming; a run cut off then
        # streamed less than its tokens say.
        streamed = "".join(var.chunks)
        text = self.engine.tokenizer.decode(generated).rstrip("\ufffd")  # an unfinished character waits
        if text.startswith(streamed) and len(text) > len(streamed):
            var.append(text[len(streamed) :])

    def _drop_lease(self) -> None:
        if self.lease is not None and self.prefixes is not None:
            self.prefixes.release(self.lease)
        self.lease = None

    async def free(self) -> None:
        """Release the context (the engine frees it when the work queued on it ends) and the lease."""
        self._drop_lease()
        self.call.encodings.clear()
        self.call.points.clear()
        self.prompt_ids = []
        self.pending = None
        if not self.has_context:
            return
        if self.engine.alive:
            await free_engine_context(self.engine.client, self.context_id)
        self.has_context = False
