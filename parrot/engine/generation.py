"""What happens to a sampled token: append it, detokenize, check stop conditions, emit an event.

Owned by the engine loop thread; pure bookkeeping on a job and its context, no tensors.
"""

from __future__ import annotations

from parrot.engine.kv.context import Context
from parrot.engine.sampler import SampleRow, new_generator
from parrot.engine.sched.job import Job
from parrot.protocol.engine_api import TokenEvent
from parrot.text.tokenizer import IncrementalDecoder, Tokenizer


def begin_generation(job: Job, tokenizer: Tokenizer) -> None:
    assert job.sampling is not None
    job.sample_row = SampleRow(job.sampling, new_generator(job.sampling))
    job.decoder = IncrementalDecoder(tokenizer)


def accept_token(
    job: Job, ctx: Context, token_id: int, logprob: float, eos_ids: frozenset[int], max_model_len: int
) -> TokenEvent:
    """Apply one sampled token to `job` and `ctx`; the returned event says if generation ended."""
    params, decoder = job.sampling, job.decoder
    assert params is not None and decoder is not None
    job.num_generated += 1
    if token_id in eos_ids and not params.ignore_eos:
        # EOS ends the output and is not appended: a later Fill continues the text itself.
        return TokenEvent(token_id=token_id, logprob=logprob, text=_flush(job), finish_reason="eos")
    ctx.tokens.append(token_id)
    pending = job.stop_window + decoder.push(token_id)
    finish = None
    if params.stop:
        hit = _find_stop(pending, params.stop)
        if hit is not None:
            job.stop_window = ""
            return TokenEvent(token_id=token_id, logprob=logprob, text=pending[:hit], finish_reason="stop")
        hold = _stop_prefix_len(pending, params.stop)
        text, job.stop_window = pending[: len(pending) - hold], pending[len(pending) - hold :]
    else:
        text = pending
    if token_id in params.stop_token_ids:
        finish = "stop"
    elif job.num_generated >= params.max_tokens or len(ctx.tokens) >= max_model_len:
        finish = "length"
    if finish is not None:
        text += _flush(job)
    return TokenEvent(token_id=token_id, logprob=logprob, text=text, finish_reason=finish)


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
