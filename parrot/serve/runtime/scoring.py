"""Scoring fills for a call runner (call_runner.py): options scored as forks of a filled prompt
(a scored `select`), and a prompt filled as one scoring fill (`prompt_logprobs`)."""

from __future__ import annotations

import asyncio

from parrot.protocol.engine_api import ExtendRequest, Filled, TopLogprob
from parrot.protocol.engine_client import EngineClient, extend_only
from parrot.protocol.errors import ParrotError
from parrot.protocol.objective import Objective
from parrot.serve.runtime.contexts import free_engine_context

# One token with its logprob and its top alternatives (when asked for), as a run record keeps each
# generated token (CallRun.output_tokens) and each scored prompt token (CallRun.prompt_tokens).
StreamedToken = tuple[int, float | None, list[TopLogprob] | None]


async def score_options(
    client: EngineClient, context_id: str, options: list[list[int]], objective: Objective, priority: int
) -> list[Filled] | None:
    """Each option's tokens as a scoring fork of `context_id`, all sent at once (one engine step
    for all); their results, or None when the engine cannot score. The forks are freed either way."""
    forks = [f"{context_id}.choice{i}" for i in range(len(options))]
    fills = [_scoring(fork, ids, objective, priority, context_id) for fork, ids in zip(forks, options, strict=True)]
    try:
        results = await asyncio.gather(*(extend_only(client, f) for f in fills))
    except ParrotError as e:
        if e.field == "score":
            return None
        raise
    finally:
        await asyncio.gather(*(free_engine_context(client, fork) for fork in forks))
    return list(results)


def scored_tokens(token_ids: list[int], result: Filled) -> list[StreamedToken]:
    """A scoring fill's tokens, each with its logprob and alternatives (None where not reported)."""
    logprobs = result.token_logprobs or [None] * len(token_ids)
    tops = result.top_logprobs or [None] * len(token_ids)
    return list(zip(token_ids, logprobs, tops, strict=True))


async def score_prompt(
    client: EngineClient, context_id: str, token_ids: list[int], top: int, objective: Objective, priority: int
) -> list[StreamedToken]:
    """`token_ids` as one scoring fill creating `context_id`: each token with its logprob and `top`
    alternatives. An engine that cannot score: ParrotError (400) naming `sampling.prompt_logprobs`."""
    try:
        result = await extend_only(client, _scoring(context_id, token_ids, objective, priority, top=top))
    except ParrotError as e:
        if e.field != "score":
            raise
        raise ParrotError(f"prompt_logprobs: {e.message}", field="sampling.prompt_logprobs") from None
    return scored_tokens(token_ids, result)


def _scoring(
    context_id: str, token_ids: list[int], objective: Objective, priority: int, parent: str | None = None, top: int = 0
) -> ExtendRequest:
    """A scoring fill of `token_ids` into `context_id` (a fork of `parent`, if given)."""
    return ExtendRequest(
        context_id=context_id,
        token_ids=token_ids,
        parent_context_id=parent,
        objective=objective,
        priority=priority,
        score=True,
        top_logprobs=top,
    )
