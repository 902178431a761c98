"""Request-level clients: how applications call LLM services today, one completion per call.

The client renders each prompt itself, sends it, and waits for the answer before it can render a
prompt that depends on it (LangChain's chains over an OpenAI-compatible endpoint do exactly this).
Every request pays a simulated network round trip (`Networked`, see benchmarks/common/netsim.py).

- `OpenAIClient`: the official `openai` package against any OpenAI-compatible `/v1/completions`
  (Parrot's manager, real vLLM). Outputs have a fixed length, as in the paper: `ignore_eos` (a
  vLLM extension) with `max_tokens`; the reported `completion_tokens` is checked for every request.
- `SessionClient`: the same request over Parrot's public session API (a one-call session with the
  rendered prompt as an inline value), which is what the manager's OpenAI routes do internally.
  Used for the manager while its OpenAI routes refuse `ignore_eos`; it cannot see token counts,
  so the runner checks the engine's generated-token count instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from benchmarks.common.netsim import RttSampler
from parrot.frontend import AsyncSession, SamplingParams, SemanticFunction
from parrot.protocol.template import Placeholder, PlaceholderKind, TextPiece, parse_template


class OutputError(AssertionError):
    """A completion is not what the workload asked for (wrong length, empty)."""


@dataclass(frozen=True)
class Completion:
    text: str
    num_tokens: int | None  # generated tokens, when the endpoint reports them


class RequestClient(Protocol):
    name: str

    async def complete(self, prompt: str, max_tokens: int) -> Completion:
        """One greedy completion of exactly `max_tokens` tokens (EOS ignored)."""
        ...

    async def aclose(self) -> None: ...


def render_prompt(template: str, values: Mapping[str, str]) -> str:
    """The prompt a request-level client sends: the template's text up to its (single, last)
    output, with every input replaced by its value."""
    parsed = parse_template(template)
    if len(parsed.output_names) != 1:
        raise ValueError("a request-level call generates one output")
    parts: list[str] = []
    for piece in parsed.pieces:
        if isinstance(piece, TextPiece):
            parts.append(piece.text)
        elif piece.kind is PlaceholderKind.INPUT:
            parts.append(values[piece.name])
        else:
            assert isinstance(piece, Placeholder)
            break
    return "".join(parts)


def check_completion(completion: Completion, max_tokens: int, where: str) -> Completion:
    if not completion.text:
        raise OutputError(f"{where}: empty completion")
    if completion.num_tokens is not None and completion.num_tokens != max_tokens:
        raise OutputError(f"{where}: {completion.num_tokens} tokens generated, expected exactly {max_tokens}")
    return completion


class OpenAIClient:
    """`openai.AsyncOpenAI` on `<base_url>/v1/completions`, greedy, EOS ignored."""

    def __init__(self, base_url: str, model: str, api_key: str = "bench", name: str = "openai") -> None:
        import openai  # a dev dependency: only the benchmarks need it

        self.name = name
        self.model = model
        # Token counts the endpoint reported, summed over every request (a profile for peers whose
        # engine we cannot read): prompt tokens, those served from its prefix cache, and generated.
        self.usage = {"prompt_tokens": 0, "cached_tokens": 0, "completion_tokens": 0}
        self._client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0, timeout=1800.0)

    async def complete(self, prompt: str, max_tokens: int) -> Completion:
        response = await self._client.completions.create(
            model=self.model,
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=0.0,
            extra_body={"ignore_eos": True},
        )
        usage = response.usage
        if usage is not None:
            details = usage.prompt_tokens_details
            self.usage["prompt_tokens"] += usage.prompt_tokens
            self.usage["cached_tokens"] += (details.cached_tokens or 0) if details is not None else 0
            self.usage["completion_tokens"] += usage.completion_tokens
        completion = Completion(response.choices[0].text, None if usage is None else usage.completion_tokens)
        return check_completion(completion, max_tokens, self.name)

    async def aclose(self) -> None:
        await self._client.close()


class SessionClient:
    """One request = one Parrot session with one call whose prompt is an inline value."""

    TEMPLATE = "{{input:prompt}}{{output:completion}}"

    def __init__(self, base_url: str, api_key: str = "bench", name: str = "parrot-session") -> None:
        self.name = name
        self.base_url = base_url
        self.api_key = api_key
        self._functions: dict[int, SemanticFunction] = {}

    def _function(self, max_tokens: int) -> SemanticFunction:
        fn = self._functions.get(max_tokens)
        if fn is None:
            sampling = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
            fn = SemanticFunction("request", self.TEMPLATE, ["prompt"], {"completion": sampling})
            self._functions[max_tokens] = fn
        return fn

    async def complete(self, prompt: str, max_tokens: int) -> Completion:
        async with AsyncSession(self.base_url, api_key=self.api_key) as session:
            var = self._function(max_tokens).invoke(session.core, prompt)
            text = await var.aget()
        return check_completion(Completion(text, None), max_tokens, self.name)

    async def aclose(self) -> None:
        return None


class Networked:
    """A request client whose every request pays one simulated round trip."""

    def __init__(self, inner: RequestClient, rtt: RttSampler) -> None:
        self.inner = inner
        self.rtt = rtt
        self.name = inner.name
        self.num_requests = 0

    async def complete(self, prompt: str, max_tokens: int) -> Completion:
        self.num_requests += 1
        return await self.rtt.around(self.inner.complete(prompt, max_tokens))

    async def complete_all(self, prompts: list[str], max_tokens: int) -> list[Completion]:
        """Concurrent independent requests (LangChain's `batch`/`abatch`)."""
        return list(await asyncio.gather(*(self.complete(p, max_tokens) for p in prompts)))

    async def aclose(self) -> None:
        await self.inner.aclose()
