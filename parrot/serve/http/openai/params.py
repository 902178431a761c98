"""An OpenAI request's settings as Parrot's: sampling, the output constraint, the tools in play.

Every option is either carried into `SamplingParams` or refused with a 400 naming it; none is
dropped. A constraint comes from at most one of `response_format`, vLLM's `structured_outputs`
and a forced tool call (`tool_choice` required or named).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from parrot.protocol.errors import ParrotError
from parrot.protocol.openai_api import ChatCompletionRequest, CompletionRequest, NamedToolChoice
from parrot.protocol.sampling import SamplingParams
from parrot.text.tools import tool_call_schema

Request = CompletionRequest | ChatCompletionRequest


@dataclass(frozen=True)
class ToolUse:
    """The tools a chat offers and how their calls are read: `forced` outputs are one call's
    bare JSON (constrained); otherwise calls are found in the text (tools.parse_tool_calls)."""

    specs: list[dict[str, Any]]  # the function specs, as the client sent them
    forced: bool

    @property
    def names(self) -> set[str]:
        return {f["name"] for f in self.specs}


def tool_use(req: ChatCompletionRequest) -> ToolUse | None:
    """None: no tools, or tool_choice "none" (the tools are still described to the model)."""
    if req.tool_choice is not None and not req.tools and req.tool_choice != "none":
        raise ParrotError("tool_choice needs tools", field="tool_choice")
    if not req.tools or req.tool_choice == "none":
        return None
    specs = [t.function.model_dump(exclude_none=True) for t in req.tools]
    choice = req.tool_choice
    if isinstance(choice, NamedToolChoice):
        named = [f for f in specs if f["name"] == choice.function.name]
        if not named:
            raise ParrotError(f"tool_choice names {choice.function.name!r}, which is not in tools", field="tool_choice")
        return ToolUse(named, forced=True)
    return ToolUse(specs, forced=choice == "required")


def constraint(req: Request, tools: ToolUse | None = None) -> tuple[dict[str, Any], str | None]:
    """The SamplingParams fields of the request's one output constraint (empty: none) and the
    request field it comes from (an engine's error about it names that field)."""
    found: list[tuple[str, dict[str, Any]]] = []
    fmt = req.response_format
    if fmt is not None and fmt.type == "json_object":
        found.append(("response_format", {"json_schema": {"type": "object"}}))
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise ParrotError("response_format of type json_schema needs json_schema", field="response_format")
        found.append(("response_format", {"json_schema": fmt.json_schema.schema_ or {"type": "object"}}))
    so = req.structured_outputs
    if so is not None:
        given = [(k, f, v) for k, f, v in _STRUCTURED if getattr(so, f) is not None]
        if len(given) != 1:
            raise ParrotError("structured_outputs takes exactly one of json, regex, choice", field="structured_outputs")
        key, name, value = given[0]
        found.append((f"structured_outputs.{name.rstrip('_')}", {key: value(getattr(so, name))}))
    if tools is not None and tools.forced:
        found.append(("tool_choice", {"json_schema": tool_call_schema(tools.specs)}))
    if len(found) > 1:
        raise ParrotError(f"{found[0][0]} and {found[1][0]} both constrain the output: give one", field=found[1][0])
    return (found[0][1], found[0][0]) if found else ({}, None)


def sampling_params(req: Request, max_tokens: int, top_logprobs: int, extra: dict[str, Any]) -> SamplingParams:
    """The request's sampling settings under the engines' limits: a 400 naming the field, not a 500."""
    fields: dict[str, Any] = {
        "max_tokens": max_tokens,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "seed": req.seed,
        "stop": [req.stop] if isinstance(req.stop, str) else list(req.stop or []),
        "top_k": req.top_k or 0,
        "ignore_eos": req.ignore_eos,
        "stop_token_ids": req.stop_token_ids or [],
        "top_logprobs": top_logprobs,
        "presence_penalty": req.presence_penalty or 0.0,
        "frequency_penalty": req.frequency_penalty or 0.0,
        "repetition_penalty": 1.0 if req.repetition_penalty is None else req.repetition_penalty,
        "logit_bias": _logit_bias(req.logit_bias),
        **extra,
    }
    try:
        return SamplingParams(**fields)
    except ValidationError as e:
        first = e.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or None
        if field is None and extra:  # a model-level rule (one constraint, no ignore_eos with one)
            field = "ignore_eos" if req.ignore_eos else next(iter(extra))
        raise ParrotError(f"{field}: {first['msg']}", field=field) from None


_STRUCTURED = (("json_schema", "json_", dict), ("regex", "regex", str), ("choices", "choice", list))


def request_field(error: ParrotError, constraint_field: str | None) -> ParrotError:
    """An engine's error about the sampling (`sampling.<name>`) as one about the request's field."""
    field = error.field or ""
    if not field.startswith("sampling."):
        return error
    name = field.removeprefix("sampling.")
    if name in ("json_schema", "regex", "choices") and constraint_field is not None:
        name = constraint_field
    if name == "prompt_logprobs":  # asked for by `echo` with `logprobs`
        name = "echo"
    message = error.message.split(" failed: ", 1)[-1]  # "call c0 failed: ..." -> the engine's words
    return ParrotError(message, status=error.status, field=name)


def choice_seed(seed: int | None, index: int) -> int | None:
    """Choice `index` of a seeded request with `n` > 1 samples with its own seed (else all
    choices would be the same text); choice 0 keeps the request's."""
    return seed if seed is None or index == 0 else (seed + index) % 2**63


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float]:
    out: dict[int, float] = {}
    for key, value in (bias or {}).items():
        if not key.lstrip("-").isdigit():
            raise ParrotError(f"logit_bias keys are token ids; got {key!r}", field="logit_bias")
        out[int(key)] = value
    return out
