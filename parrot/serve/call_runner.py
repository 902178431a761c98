"""Runs one semantic call on its engine through the engine API.

A call owns one engine context, `<session_id>.<call_id>`. Its prompt is filled piece by piece: an
early fill may put the ready prefix there before the call's last inputs arrive; `run` fills the
rest up to the first output, generates it, fills the text up to the next output, generates that,
and so on (the generated tokens stay in the context, so later text continues after them). Each
output variable is set the moment its generation ends, so its consumers can start while this call
still generates its later outputs.

Owned by the executor, which serializes a runner's steps (one in flight at a time).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from parrot.protocol.engine_api import FillRequest, FreeContextRequest, GenerateRequest
from parrot.protocol.errors import ParrotError
from parrot.serve.engines import EngineHandle
from parrot.serve.graph import CallNode
from parrot.serve.render import check_prompt_len, pieces_token_ids, stages
from parrot.serve.variable import Variable

log = logging.getLogger(__name__)


class CallRunner:
    def __init__(
        self,
        session_id: str,
        call: CallNode,
        variables: Mapping[str, Variable],
        engine: EngineHandle,
        on_output_set: Callable[[Variable], None],
    ) -> None:
        self.call = call
        self.variables = variables
        self.engine = engine
        self.context_id = f"{session_id}.{call.call_id}"
        self.on_output_set = on_output_set
        self.has_context = False  # a fill was sent: the engine may hold the context
        self.num_filled_pieces = 0
        self.counts_as_early_filled = False  # the executor's early-fill bookkeeping on the engine

    async def fill_to(self, stop: int) -> None:
        """Fill pieces [num_filled_pieces, stop) (all known) into the context."""
        start = self.num_filled_pieces
        if stop <= start:
            return
        token_ids = pieces_token_ids(self.call, self.variables, self.engine.tokenizer, start, stop)
        if token_ids:
            self.has_context = True  # before the await: the engine may create it even if we are cancelled
            await self.engine.client.fill(FillRequest(context_id=self.context_id, token_ids=token_ids))
            self.call.num_prompt_tokens += len(token_ids)
        self.num_filled_pieces = stop

    async def run(self) -> None:
        """Fill and generate every output; raises ParrotError (outputs not yet set stay unset)."""
        check_prompt_len(self.call, self.variables, self.engine.tokenizer, self.engine.max_model_len, field="prompt")
        for _, stop, name in stages(self.call.template):
            await self.fill_to(stop)
            if not self.has_context:
                raise ParrotError(f"the prompt before output {name!r} is empty", field="template")
            await self._generate(name)
            self.num_filled_pieces = stop + 1  # the generated tokens are in the context

    async def _generate(self, name: str) -> None:
        var = self.variables[self.call.outputs[name]]
        events = self.engine.client.generate(
            GenerateRequest(context_id=self.context_id, sampling=self.call.sampling[name])
        )
        parts: list[str] = []
        finish_reason: str | None = None
        try:
            async for event in events:
                if event.token_id is not None:
                    self.call.num_generated_tokens += 1
                if event.text:
                    parts.append(event.text)
                    var.append(event.text)
                if event.finish_reason is not None:
                    finish_reason = event.finish_reason
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
            raise ParrotError(f"the engine's stream for {name!r} ended without a finish reason", status=502)
        self.call.finish_reasons[name] = finish_reason
        if not var.is_done:  # a deleted session failed it already
            var.set("".join(parts))
            self.on_output_set(var)

    async def free(self, timeout_s: float) -> None:
        """Release the context; retried with backoff while the engine finishes work queued on it."""
        if not self.has_context:
            return
        request = FreeContextRequest(context_id=self.context_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        delay_s = 0.005
        while True:
            try:
                await self.engine.client.free_context(request)
                break
            except ParrotError as e:
                if e.status == 404:  # never created (its fill was refused)
                    break
                if e.status != 409 or loop.time() > deadline:
                    log.warning("context %s not freed: %s", self.context_id, e.message)
                    break
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, 0.25)
        self.has_context = False
