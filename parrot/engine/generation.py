"""What happens to a sampled token: append it, detokenize, check stop conditions, emit an event.

Owned by the engine loop thread; pure bookkeeping on a job and its context, no tensors. The
context holds exactly the output's text: EOS is not appended, and a stop string is cut out with
the tokens it touches (the text before it in the first of them is re-tokenized), so a later Fill
continues right after the reported text. The last event says what the context now holds.
"""

from __future__ import annotations

from typing import Any

from parrot.engine.constraints import new_matcher
from parrot.engine.kv.context import Context, ContextTable
from parrot.engine.sampler import SampleRow, new_generator
from parrot.engine.sched.job import Job
from parrot.protocol.engine_api import TokenEvent
from parrot.text.cut import cut_to_text
from parrot.text.tokenizer import IncrementalDecoder, Tokenizer


def begin_generation(job: Job, tokenizer: Tokenizer, grammar: Any = None) -> None:
    """`grammar`: the request's compiled constraint (constraints.Grammars.check), if any."""
    assert job.sampling is not None
    matcher = new_matcher(grammar) if grammar is not None else None
    job.sample_row = SampleRow(job.sampling, new_generator(job.sampling), matcher)
    job.decoder = IncrementalDecoder(tokenizer)


def accept_token(
    job: Job,
    contexts: ContextTable,
    ctx: Context,
    token_id: int,
    logprob: float,
    eos_ids: frozenset[int],
    max_model_len: int,
) -> TokenEvent:
    """Apply one sampled token to `job` and `ctx`; the returned event says if generation ended."""
    event = _accept(job, contexts, ctx, token_id, logprob, eos_ids, max_model_len)
    row = job.sample_row
    assert row is not None
    extra: dict[str, Any] = {}
    if row.top is not None:
        extra["top_logprobs"] = row.top
    if job.sampling is not None and job.sampling.choices is not None and event.finish_reason is not None:
        assert job.decoder is not None  # the chosen option's score: its tokens' logprobs (EOS included)
        extra["choice_logprobs"] = {job.decoder.text: row.logprob_sum}
    return event.model_copy(update=extra) if extra else event


def _accept(
    job: Job,
    contexts: ContextTable,
    ctx: Context,
    token_id: int,
    logprob: float,
    eos_ids: frozenset[int],
    max_model_len: int,
) -> TokenEvent:
    params, decoder = job.sampling, job.decoder
    assert params is not None and decoder is not None
    job.num_generated += 1
    if token_id in eos_ids and not params.ignore_eos:
        # EOS ends the output and is not appended: a later Fill continues the text itself.
        return _last(job, TokenEvent(token_id=token_id, logprob=logprob, text=_flush(job), finish_reason="eos"))
    ctx.tokens.append(token_id)
    job.output_token_ids.append(token_id)
    pending = job.stop_window + decoder.push(token_id)
    finish = None
    if params.stop:
        hit = _find_stop(pending, params.stop)
        if hit is not None:
            job.stop_window = ""
            # `pending` is the tail of the decoded text that was not reported yet.
            _cut_to_text(job, contexts, ctx, decoder.text[: len(decoder.text) - len(pending) + hit])
            return _last(job, TokenEvent(token_id=token_id, logprob=logprob, text=pending[:hit], finish_reason="stop"))
        hold = _stop_prefix_len(pending, params.stop)
        text, job.stop_window = pending[: len(pending) - hold], pending[len(pending) - hold :]
    else:
        text = pending
    if token_id in params.stop_token_ids:
        finish = "stop"
    elif job.num_generated >= params.max_tokens or len(ctx.tokens) >= max_model_len:
        finish = "length"
    if finish is None:
        return TokenEvent(token_id=token_id, logprob=logprob, text=text)
    return _last(job, TokenEvent(token_id=token_id, logprob=logprob, text=text + _flush(job), finish_reason=finish))


def _last(job: Job, event: TokenEvent) -> TokenEvent:
    return event.model_copy(update={"output_token_ids": list(job.output_token_ids)})


def _cut_to_text(job: Job, contexts: ContextTable, ctx: Context, text: str) -> None:
    """Cut this generation's tokens in `ctx` back to exactly `text` (the output before its stop)."""
    assert job.decoder is not None
    num_kept, tail = cut_to_text(job.decoder.tokenizer, job.output_token_ids, text)
    start = len(ctx.tokens) - len(job.output_token_ids)
    contexts.truncate(ctx, start + num_kept)
    ctx.tokens.extend(tail)  # not computed yet: the next Fill or Generate computes them
    job.output_token_ids[num_kept:] = tail


def _flush(job: Job) -> str:
    held, job.stop_window = job.stop_window, ""
    return held


def _find_stop(text: str, stops: list[str]) -> int | None:
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


def _stop_prefix_len(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of `text` that begins some stop string (held back)."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best
