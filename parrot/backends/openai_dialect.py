"""The OpenAI-compatible dialect the engine adapter speaks to its upstream (openai_engine.py).

Pure functions, no I/O: the `/v1/completions` request body for a context and its sampling
settings, one streamed chunk turned into engine-API `TokenEvent`s, an upstream error body turned
into a `ParrotError`, a call's objective and priority as vLLM's request `priority`. Unit-testable
on hand-written chunks (vLLM's and Parrot's shapes).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parrot.protocol.engine_api import TokenEvent, TopLogprob
from parrot.protocol.errors import ParrotError
from parrot.protocol.objective import Objective
from parrot.protocol.openai_api import TOKEN_ID_PREFIX
from parrot.protocol.sampling import SamplingParams

# An upstream finish reason -> the engine API's; "stop" is split into "eos" / "stop" by the token.
_FINISH = {"length": "length", "stop": "stop", "abort": "aborted"}
# vLLM serves smaller `priority` values first; Parrot's priorities lie in [-1000, 1000], so every
# latency-critical request (at most 1000) goes before every throughput one (at least 1001).
THROUGHPUT_PRIORITY_BASE = 2001


def upstream_priority(objective: Objective, priority: int) -> int:
    """A call's objective and priority as vLLM's request priority (`--scheduling-policy priority`):
    latency-critical work first, then the higher Parrot priority, as the builtin engine orders
    them (it also ages waiting work into the front tier; vLLM does not, the manager's aging does)."""
    return (0 if objective is Objective.LATENCY else THROUGHPUT_PRIORITY_BASE) - priority


def completion_body(
    model: str,
    token_ids: Sequence[int],
    sampling: SamplingParams,
    max_tokens: int,
    ask_token_ids: bool,
    priority: int = 0,
    stream_interval: int = 1,
    logprobs: bool = True,
) -> dict[str, Any]:
    """A streamed completion of `token_ids`. vLLM extensions are sent only when they say
    something (`top_k`, `ignore_eos`, `stop_token_ids`, `repetition_penalty`, `structured_outputs`,
    a non-zero `priority`: vLLM's default is 0, and it refuses any other value unless started with
    `--scheduling-policy priority`), so plain OpenAI servers see plain requests; `ask_token_ids`
    adds `logprobs` (0, or the alternatives asked for) with `return_tokens_as_token_ids` (tokens as
    ids, vLLM), or, with `logprobs` False and no alternatives, vLLM's `return_token_ids` alone (the
    ids without logprobs: computing them cost vLLM ~3% per token, `benchmarks.serving.vllm_paths`).
    Every other sampling setting is OpenAI's own (penalties, `logit_bias`). Raises ParrotError
    (400) for what the upstream cannot be asked: alternatives reported by text only (no token ids
    to report them with), a choice's score. `stream_interval` > 1 (vLLM): tokens per streamed
    chunk."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(token_ids),
        "max_tokens": max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    if sampling.top_k:
        body["top_k"] = sampling.top_k
    if sampling.stop_token_ids:
        body["stop_token_ids"] = list(sampling.stop_token_ids)
    if sampling.ignore_eos:
        body["ignore_eos"] = True
    if sampling.presence_penalty:
        body["presence_penalty"] = sampling.presence_penalty
    if sampling.frequency_penalty:
        body["frequency_penalty"] = sampling.frequency_penalty
    if sampling.repetition_penalty != 1.0:
        body["repetition_penalty"] = sampling.repetition_penalty
    if sampling.logit_bias:
        body["logit_bias"] = {str(t): v for t, v in sampling.logit_bias.items()}
    if sampling.json_schema is not None:
        body["structured_outputs"] = {"json": sampling.json_schema}
    elif sampling.regex is not None:
        body["structured_outputs"] = {"regex": sampling.regex}
    elif sampling.choices is not None:
        body["structured_outputs"] = {"choice": list(sampling.choices)}
    if sampling.top_logprobs and not ask_token_ids:
        raise ParrotError(
            "top_logprobs needs an upstream that reports tokens as ids (vLLM's return_tokens_as_token_ids)",
            field="sampling.top_logprobs",
        )
    if ask_token_ids and (logprobs or sampling.top_logprobs):
        body["logprobs"] = sampling.top_logprobs
        body["return_tokens_as_token_ids"] = True
    elif ask_token_ids:
        body["return_token_ids"] = True
    if priority:
        body["priority"] = priority
    if stream_interval > 1:
        body["stream_interval"] = stream_interval
    return body


def chunk_top_logprobs(choice: dict[str, Any], num_tokens: int) -> list[list[TopLogprob] | None]:
    """Each token's alternatives under vLLM's `logprobs` ("token_id:<n>" -> logprob; it adds the
    sampled token to the k asked for), most likely first; None where the upstream sent none."""
    logprobs = choice.get("logprobs")
    tops = logprobs.get("top_logprobs") if isinstance(logprobs, dict) else None
    if not isinstance(tops, list) or len(tops) != num_tokens:
        return [None] * num_tokens
    out: list[list[TopLogprob] | None] = []
    for top in tops:
        if not isinstance(top, dict) or not top:
            out.append(None)
            continue
        entries = [
            TopLogprob(token_id=int(k[len(TOKEN_ID_PREFIX) :]), logprob=float(v))
            for k, v in top.items()
            if isinstance(k, str) and k.startswith(TOKEN_ID_PREFIX) and k[len(TOKEN_ID_PREFIX) :].isdigit()
        ]
        out.append(sorted(entries, key=lambda t: -t.logprob) or None)
    return out


def refuses_priority(body: dict[str, Any], status: int, text: str) -> bool:
    """An upstream that cannot take `priority`: vLLM without priority scheduling (400 "Got priority
    ... but Priority scheduling is not enabled"), a server that forbids unknown fields (400/422
    naming it)."""
    return refuses_field("priority", body, status, text)


def refuses_field(name: str, body: dict[str, Any], status: int, text: str) -> bool:
    """The upstream refused the optional field `name` of `body` (a 400 or 422 naming it): e.g.
    `return_token_ids` at a server that does not know vLLM's field (Parrot's own forbids it)."""
    return name in body and status in (400, 422) and name in text.lower()


def with_logprobs_ids(body: dict[str, Any]) -> dict[str, Any]:
    """`body` asking for token ids through `logprobs: 0` + `return_tokens_as_token_ids` instead of
    `return_token_ids` (for an upstream that refuses the latter)."""
    rest = {k: v for k, v in body.items() if k != "return_token_ids"}
    return rest | {"logprobs": 0, "return_tokens_as_token_ids": True}


def chunk_token_ids(choice: dict[str, Any]) -> tuple[list[int], list[float | None]] | None:
    """The tokens of one streamed choice with their logprobs, if the upstream gave them as ids:
    vLLM's `token_ids` field, or "token_id:<n>" tokens under `logprobs` (an empty list there is
    an answer too: a chunk whose text lagged behind its tokens). None: it did not."""
    logprobs = choice.get("logprobs")
    tokens: list[Any] = []
    lps: list[float | None] = []
    if isinstance(logprobs, dict) and isinstance(logprobs.get("tokens"), list):
        tokens = logprobs["tokens"]
        lps = list(logprobs.get("token_logprobs") or [])
    ids = choice.get("token_ids")
    if isinstance(ids, list) and all(isinstance(t, int) for t in ids):
        return [int(t) for t in ids], lps if len(lps) == len(ids) else [None] * len(ids)
    if not isinstance(logprobs, dict) or not isinstance(logprobs.get("tokens"), list):
        return None
    if not all(isinstance(t, str) and t.startswith(TOKEN_ID_PREFIX) for t in tokens):
        return None  # tokens as text: the upstream ignored return_tokens_as_token_ids
    try:
        parsed = [int(t[len(TOKEN_ID_PREFIX) :]) for t in tokens]
    except ValueError:
        return None
    return parsed, lps if len(lps) == len(parsed) else [None] * len(parsed)


@dataclass(frozen=True)
class StopRule:
    """How to tell an EOS finish from a stop-string or stop-token finish (both "stop" upstream)."""

    eos_ids: frozenset[int]  # empty: unknown (no tokenizer folder)
    ignore_eos: bool

    def finish(self, choice: dict[str, Any], last_token_id: int | None) -> str:
        reason = choice.get("finish_reason")
        mapped = _FINISH.get(str(reason), "error")
        if mapped != "stop" or self.ignore_eos or last_token_id is None:
            return mapped
        if self.eos_ids:
            return "eos" if last_token_id in self.eos_ids else "stop"
        # vLLM names what stopped it; None means the EOS (its token is the last one streamed).
        return "eos" if "stop_reason" in choice and choice["stop_reason"] is None else "stop"


def choice_events(
    choice: dict[str, Any], retokenize: Callable[[str], list[int]] | None, rule: StopRule, num_top: int = 0
) -> list[TokenEvent]:
    """One streamed choice as engine-API events: one per token, the chunk's text on its last token,
    the finish reason on the last event (a token-less event when the finish came alone).

    Without ids from the upstream, the chunk's text is re-tokenized (`retokenize`); those events
    carry no logprob. `num_top`: the alternatives asked for per token (sampling.top_logprobs)."""
    text = str(choice.get("text") or "")
    found = chunk_token_ids(choice)
    if found is not None:
        ids, logprobs = found
    elif not text:
        ids, logprobs = [], []
    elif retokenize is None:
        raise ParrotError(
            "the upstream streamed no token ids and the adapter has no tokenizer to re-tokenize its text: "
            "configure a tokenizer folder",
            status=502,
            field="tokenizer",
        )
    else:
        ids = retokenize(text)
        logprobs = [None] * len(ids)
    tops: list[list[TopLogprob] | None] = [None] * len(ids)
    if num_top and found is not None:
        tops = [None if t is None else t[:num_top] for t in chunk_top_logprobs(choice, len(ids))]
    events = [
        TokenEvent(token_id=t, logprob=lp, top_logprobs=top) for t, lp, top in zip(ids, logprobs, tops, strict=True)
    ]
    update: dict[str, Any] = {"text": text} if text else {}
    upstream_reason = choice.get("finish_reason")
    if upstream_reason is not None:
        update["finish_reason"] = rule.finish(choice, ids[-1] if ids else None)
        if update["finish_reason"] == "error":
            update["error"] = f"upstream finish_reason {upstream_reason!r}"
    if update and not events:
        events.append(TokenEvent(token_id=None))
    if update:
        events[-1] = events[-1].model_copy(update=update)
    return events


def upstream_error(base_url: str, status: int, text: str) -> ParrotError:
    """An upstream error answer (Parrot's, vLLM's or OpenAI's body) with its status and message."""
    message, param = text or f"status {status}", None
    try:
        body = json.loads(text)
    except (json.JSONDecodeError, ValueError):
        body = None
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            message = str(err.get("message") or err.get("detail") or message)
            param = err.get("field") or err.get("param")
        elif isinstance(err, str):
            message = err
    where = f" (its field {param!r})" if param else ""
    return ParrotError(f"upstream {base_url} answered {status}{where}: {message}", status=status)


def eos_token_ids(folder: Path, tokenizer_eos_id: int | None) -> frozenset[int]:
    """The model's EOS ids: the tokenizer's and those of config.json / generation_config.json."""
    ids = {tokenizer_eos_id} if tokenizer_eos_id is not None else set()
    for name in ("config.json", "generation_config.json"):
        path = folder / name
        if path.exists():
            value = json.loads(path.read_text()).get("eos_token_id")
            ids.update(int(v) for v in (value if isinstance(value, list) else [value]) if v is not None)
    return frozenset(ids)


async def sse_chunks(lines: AsyncIterable[str], base_url: str) -> AsyncIterator[dict[str, Any]]:
    """The JSON objects of a server-sent event stream's lines, until `[DONE]`."""
    async for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            return
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError as e:
            raise ParrotError(
                f"the upstream {base_url} streamed an unreadable chunk: {data[:200]!r}", status=502
            ) from e
        if isinstance(chunk, dict):
            yield chunk


def error_status(chunk: dict[str, Any]) -> int:
    """The status an in-stream error names (Parrot: `status`, vLLM: `code`), else 500."""
    error = chunk.get("error")
    status = error.get("status") or error.get("code") if isinstance(error, dict) else None
    return status if isinstance(status, int) and 400 <= status < 600 else 500


def prompt_usage(usage: dict[str, Any] | None, prompt_len: int) -> tuple[int, int]:
    """(computed, cached) prompt tokens as the upstream reports them: its prompt tokens less its
    cached ones, and those (all computed, none cached, if it reports no usage)."""
    if usage is None or not isinstance(usage.get("prompt_tokens"), int):
        return prompt_len, 0
    details = usage.get("prompt_tokens_details")
    cached = int((details.get("cached_tokens") if isinstance(details, dict) else 0) or 0)
    return int(usage["prompt_tokens"]) - cached, cached
