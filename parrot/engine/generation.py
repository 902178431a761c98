"""What a sampled token does to its generation and its context: the engine core's half (lock held).

`append_token` counts the token, appends it to the context and the output (EOS is not appended:
a later Extend continues the text itself; `end_generations` then leaves the context's last token
uncomputed, as every request leaves it) and names the finish the token alone decides (EOS, a stop
token, max_tokens, the model's length). The text half (detokenizing, stop strings, the event) runs
outside the lock in `output.py`; a stop string found there is cut out of the context under the lock
again (`cut_to_text`), before the generation ends. Pure bookkeeping on a job and its context, no
tensors.
"""

from __future__ import annotations

from typing import Any

from parrot.engine.constraints import new_matcher
from parrot.engine.kv.context import Context, ContextTable
from parrot.engine.output import RowOutput
from parrot.engine.sampler import SampleRow, new_generator
from parrot.engine.sched.job import Job
from parrot.engine.sched.scheduler import Scheduler
from parrot.text.cut import cut_to_text as cut_tokens
from parrot.text.tokenizer import IncrementalDecoder, Tokenizer


def begin_generation(job: Job, tokenizer: Tokenizer, grammar: Any = None) -> None:
    """`grammar`: the request's compiled constraint (constraints.Grammars.check), if any."""
    assert job.sampling is not None
    matcher = new_matcher(grammar) if grammar is not None else None
    job.sample_row = SampleRow(job.sampling, new_generator(job.sampling), matcher)
    job.decoder = IncrementalDecoder(tokenizer)


def append_token(job: Job, ctx: Context, token_id: int, eos_ids: frozenset[int], max_model_len: int) -> str | None:
    """Apply one sampled token to `job` and `ctx`; returns the finish reason it decides, if any."""
    params = job.sampling
    assert params is not None
    job.num_generated += 1
    if token_id in eos_ids and not params.ignore_eos:
        return "eos"
    ctx.tokens.append(token_id)
    job.output_token_ids.append(token_id)
    if token_id in params.stop_token_ids:
        return "stop"
    if job.num_generated >= params.max_tokens or len(ctx.tokens) >= max_model_len:
        return "length"
    return None


def cut_to_text(job: Job, contexts: ContextTable, ctx: Context, text: str) -> None:
    """Cut this generation's tokens in `ctx` back to exactly `text` (the output before its stop
    string): the tokens the stop touches go, the text before it in the first of them is
    re-tokenized (not computed yet: the next Extend computes it)."""
    assert job.decoder is not None
    num_kept, tail = cut_tokens(job.decoder.tokenizer, job.output_token_ids, text)
    start = len(ctx.tokens) - len(job.output_token_ids)
    contexts.truncate(ctx, start + num_kept)
    ctx.tokens.extend(tail)
    job.output_token_ids[num_kept:] = tail


def end_generations(rows: list[RowOutput], contexts: ContextTable, scheduler: Scheduler) -> None:
    """The generations that finished in a step end, after the output processor rendered their
    rows: a stop string's cut first, so the last event's `output_token_ids` say what the context
    holds."""
    for row in rows:
        if row.finish is None:
            continue
        job = row.job
        if row.cut_text is not None:
            cut_to_text(job, contexts, contexts.get(job.context_id), row.cut_text)
        scheduler.finish(job)
        ctx = contexts.get(job.context_id)
        if ctx.num_computed >= len(ctx.tokens) > 0:
            # EOS (not appended) was sampled from the last token's logits: that token is left
            # uncomputed again, as every request leaves it, so a generation or a fork's generation
            # right after this one computes it and samples (it found nothing to compute: a hang).
            contexts.uncompute_last(ctx)
        assert row.event is not None
        row.event = row.event.model_copy(update={"output_token_ids": list(job.output_token_ids)})
