"""The output processor: a step's sampled tokens to events, outside the engine lock.

After the forward pass the engine core (lock held) appends each sampled token to its context and
leaves a `RowOutput` (`generation.append_token`). Here, without the lock and in the loop thread
that owns each job's decoder and stop window, every row is detokenized, matched against its stop
strings and turned into its TokenEvent. A stop string found here is reported back through
`RowOutput.cut_text`; the core cuts the context to it and ends the generation before the step's
events are handed out (`LLMEngine.hand_off`, one call per step), so the last event of a
generation still says what its context holds. As vLLM v1's output processor, minus the process
boundary: the text work does not hold the lock that submissions, frees and stats take.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parrot.engine.sched.job import Job
from parrot.protocol.engine_api import TokenEvent


@dataclass(slots=True)
class RowOutput:
    """One sampled token of a generation, as the engine core leaves it to the output processor."""

    job: Job
    token_id: int
    logprob: float
    finish: str | None  # decided by the token (eos, stop token, length); a stop string sets "stop"
    event: TokenEvent | None = None  # set by `render`
    cut_text: str | None = None  # a stop string hit: the output's text before it (cut the context)


def render(row: RowOutput) -> None:
    """Detokenize `row`'s token, match its generation's stop strings and build its event (with the
    token's alternatives and, at the end of a choice, its score, where the request asked; the
    generation's first event also says what its extend's tokens did)."""
    _render(row)
    job, event = row.job, row.event
    sample_row, params = job.sample_row, job.sampling
    assert event is not None and sample_row is not None and params is not None and job.decoder is not None
    extra: dict[str, Any] = {}
    if sample_row.top is not None:
        extra["top_logprobs"] = sample_row.top
    if params.choices is not None and event.finish_reason is not None:
        extra["choice_logprobs"] = {job.decoder.text: sample_row.logprob_sum}  # its tokens' logprobs, EOS included
    if job.filled is not None:  # the first event of an extend that had tokens reports them
        extra["filled"], job.filled = job.filled, None
    if extra:
        row.event = event.model_copy(update=extra)


def _render(row: RowOutput) -> None:
    job, token_id, logprob = row.job, row.token_id, row.logprob
    params, decoder = job.sampling, job.decoder
    assert params is not None and decoder is not None
    if row.finish == "eos":  # EOS is not part of the output: only held-back text remains
        row.event = TokenEvent(token_id=token_id, logprob=logprob, text=_flush(job), finish_reason="eos")
        return
    pending = job.stop_window + decoder.push(token_id)
    if params.stop:
        hit = _find_stop(pending, params.stop)
        if hit is not None:
            job.stop_window = ""
            # `pending` is the tail of the decoded text that was not reported yet.
            row.cut_text = decoder.text[: len(decoder.text) - len(pending) + hit]
            row.finish = "stop"
            row.event = TokenEvent(token_id=token_id, logprob=logprob, text=pending[:hit], finish_reason="stop")
            return
        hold = _stop_prefix_len(pending, params.stop)
        text, job.stop_window = pending[: len(pending) - hold], pending[len(pending) - hold :]
    else:
        text = pending
    if row.finish is None:
        row.event = TokenEvent(token_id=token_id, logprob=logprob, text=text)
    else:
        row.event = TokenEvent(token_id=token_id, logprob=logprob, text=text + _flush(job), finish_reason=row.finish)


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
