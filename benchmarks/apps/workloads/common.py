"""What every application benchmark shares: the target it runs against, its outcome, its data.

An application module (chain_summary, map_reduce, ...) owns its prompt templates, its scaled
parameters (`scenarios(scale)`) and two versions of the application: `run_parrot` (the Parrot SDK:
templates with Semantic Variables, the whole DAG submitted at once, one round trip per
submission) and `run_baseline` (a request-level client: render, send, wait, one round trip per
call). Both return an `Outcome`; the runner (benchmarks/apps/run.py) checks it and records it.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from benchmarks import data
from benchmarks.apps.baselines import Networked
from benchmarks.common.netsim import RoundTrip, RttSampler
from parrot.frontend import AsyncSession, SamplingParams, SemanticFunction, SemanticVariable
from parrot.protocol.template import escape_text
from parrot.text import Tokenizer

API_KEY = "bench"


@dataclass
class Target:
    """One configuration an application runs against.

    Parrot configurations have `parrot_url` (the manager's public API, used through the SDK);
    request-level ones have `client`. `server_dag=False` is the Parrot ablation in which the client
    waits for every stage's outputs before submitting the next (one round trip per stage).
    """

    config: str
    rtt: RttSampler
    parrot_url: str | None = None
    client: Networked | None = None
    server_dag: bool = True

    @property
    def is_parrot(self) -> bool:
        return self.parrot_url is not None

    def session(self) -> AsyncSession:
        assert self.parrot_url is not None
        return AsyncSession(self.parrot_url, api_key=API_KEY)

    def stream(self, key: str) -> Target:
        """This target for one independent client of the workload: its own round-trip draws
        (RttSampler.stream), the same in every configuration."""
        rtt = self.rtt.stream(key)
        client = Networked(self.client.inner, rtt) if self.client is not None else None
        return replace(self, rtt=rtt, client=client)

    def request_client(self) -> Networked:
        assert self.client is not None, f"{self.config} has no request-level client"
        return self.client

    async def run_one(self, fn: SemanticFunction, *inputs: str) -> str:
        """A one-call app as one HTTP request (`POST /v1/run`, as a plain client's), paying one
        simulated round trip; its output must not be empty."""
        assert self.parrot_url is not None
        trip = RoundTrip(self.rtt)
        await trip.out()
        text = await fn.arun(self.parrot_url, *inputs, api_key=API_KEY)
        await trip.back()
        assert text, f"{fn.name}: empty answer"
        return text


@dataclass
class Outcome:
    """What one run of an application measured (seconds and ms), and what it asked the model for."""

    metrics: dict[str, float]
    num_calls: int
    num_output_tokens: int  # the sum of every call's max_tokens (outputs are exactly that long)
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Metric:
    key: str  # in Outcome.metrics
    label: str
    unit: str
    lower_is_better: bool = True


@dataclass(frozen=True)
class Scenario:
    """One measured point of a workload: an application with fixed parameters."""

    workload: str  # the application module's NAME
    key: str  # unique in a run, e.g. "chain_summary/alone"
    label: str  # for the table
    params: Any  # the module's frozen parameter dataclass
    metrics: tuple[Metric, ...]
    paper_key: str  # key in paper_workloads.json "paper_results"
    run: Callable[[Any, Target, Corpus], Awaitable[Outcome]]
    scaling: str  # how the paper's shape was scaled (one line)
    plots: tuple[tuple[str, str, float], ...] = ()  # (figure id, x-axis label, x value) of sweep plots
    # Optimizations worth switching off here (Parrot ablations): "dag" (server-side DAG), "early_fill",
    # "prefix" (prefix sharing), "attention" (shared-prefix attention), "objective", "policy".
    ablations: tuple[str, ...] = ()
    request_configs: bool = True  # also run the request-level baselines

    def params_for(self, repeat: int) -> Any:
        """The parameters of repeat `repeat`: a module whose parameters have a `draw` field seeds
        its random schedule (arrival times) with it, so each repeat is a fresh draw of the workload
        that every configuration of that repeat shares (pairs stay paired; a row's median is not
        one schedule's luck). Repeat 0 is draw 0, the schedule every earlier run used."""
        if repeat and "draw" in {f.name for f in fields(self.params)}:
            return replace(self.params, draw=repeat)
        return self.params


def schedule_seed(name: str, draw: int) -> str:
    """The seed string of a schedule and its `draw` (Scenario.params_for): draw 0 keeps `name`."""
    return name if draw == 0 else f"{name}/draw{draw}"


# ---- data ---------------------------------------------------------------------------------------


class Corpus:
    """The workload data, tokenized with the served model's tokenizer; loaded once, lazily.

    Documents: `NUM_DOCUMENTS` State of the Union addresses of at least `MIN_DOCUMENT_TOKENS`
    tokens (the pinned loader's deterministic pick); workloads take them by index, so each
    workload reads the same documents in every configuration.
    """

    MIN_DOCUMENT_TOKENS = 8192
    NUM_DOCUMENTS = 16

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self._documents: tuple[data.Document, ...] | None = None
        self._ids: dict[str, list[int]] = {}
        self._memo: dict[tuple, tuple] = {}
        self.salt_prefix = ""

    def salted(self, salt: str) -> Corpus:
        """The same data, every text piece (chunks, truncated prompts) starting with `(run <8
        digits>)`, the digits a digest of `salt`: one run's calls share prefixes among themselves,
        but never with an earlier run or another configuration (whose caches would otherwise serve
        a repeat or a peer on the same server). Every salt is the same number of tokens (each
        digit is a token), so no configuration's prompts are longer: the salt once was the text
        of the key, and "parrot_vllm" cost each of that configuration's pieces 5 more prompt
        tokens than "d" (+4.6% computed prompt tokens on GPTs). Loaded data and tokenizations are
        shared with this corpus."""
        view = copy.copy(self)
        view.salt_prefix = f"(run {salt_digits(salt)}) "
        return view

    def documents(self, n: int, min_tokens: int) -> tuple[data.Document, ...]:
        if self._documents is None:
            self._documents = tuple(
                data.load_documents(self.MIN_DOCUMENT_TOKENS, 10**9, self.NUM_DOCUMENTS, self.tokenizer)
            )
        if n > len(self._documents) or min_tokens > self.MIN_DOCUMENT_TOKENS:
            raise ValueError(
                f"asked for {n} documents of {min_tokens}+ tokens; the corpus holds {self.NUM_DOCUMENTS} "
                f"of {self.MIN_DOCUMENT_TOKENS}+"
            )
        return self._documents[:n]

    def document_ids(self, doc: data.Document) -> list[int]:
        ids = self._ids.get(doc.name)
        if ids is None:
            ids = self._ids[doc.name] = self.tokenizer.encode(doc.text)
        return ids

    def chunks(self, doc: data.Document, chunk_tokens: int, num_chunks: int) -> list[str]:
        """The document's first `num_chunks` pieces of `chunk_tokens` tokens, as text."""
        ids = self.document_ids(doc)
        if len(ids) < chunk_tokens * num_chunks:
            raise ValueError(f"{doc.name} has {len(ids)} tokens, fewer than {num_chunks} x {chunk_tokens}")
        return [self.text(ids[i * chunk_tokens : (i + 1) * chunk_tokens]) for i in range(num_chunks)]

    def chat_turns(self, n: int, seed: int, max_prompt_tokens: int) -> tuple[data.ChatTurn, ...]:
        key = ("chat", n, seed, max_prompt_tokens)
        if key not in self._memo:
            self._memo[key] = tuple(data.load_chat_turns(n, seed, self.tokenizer, max_prompt_len=max_prompt_tokens))
        return self._memo[key]

    def system_prompts(self, n: int, seed: int) -> tuple[data.SystemPrompt, ...]:
        key = ("system", n, seed)
        if key not in self._memo:
            self._memo[key] = tuple(data.load_system_prompts(n, seed))
        return self._memo[key]

    def truncate(self, text: str, num_tokens: int) -> str:
        """The first `num_tokens` tokens of `text`, as template-safe text."""
        return self.text(self.tokenizer.encode(text)[:num_tokens])

    def text(self, ids: list[int]) -> str:
        return self.salt_prefix + literal(self.tokenizer.decode(ids))

    def num_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text))


def literal(text: str) -> str:
    """Text safe to use as constant template text (`{{` in data escaped): it renders as itself."""
    return escape_text(text)


# ---- the SDK side -------------------------------------------------------------------------------


def semantic(name: str, template: str, inputs: list[str], output: str, max_tokens: int) -> SemanticFunction:
    """A semantic function with one output of exactly `max_tokens` tokens (greedy, EOS ignored)."""
    return SemanticFunction(name, template, inputs, {output: SamplingParams(max_tokens=max_tokens, ignore_eos=True)})


async def get_all(variables: list[SemanticVariable]) -> list[str]:
    values = await asyncio.gather(*(v.aget() for v in variables))
    for v, value in zip(variables, values, strict=True):
        if not value:
            raise AssertionError(f"variable {v.var_id} ({v.name}) came back empty")
    return list(values)


class Stage:
    """The client side of a Parrot submission: half a round trip out, half back after the get.

    With the server-side DAG ablation (`target.server_dag` False) `barrier` makes the client wait
    for a stage's outputs and pay a round trip before it submits the next stage, as a client that
    orchestrates the DAG itself would.
    """

    def __init__(self, target: Target) -> None:
        self.target = target
        self.trip = RoundTrip(target.rtt)

    async def start(self) -> None:
        await self.trip.out()

    async def barrier(self, outputs: list[SemanticVariable]) -> None:
        if self.target.server_dag:
            return
        await get_all(outputs)
        await self.trip.back()
        self.trip = RoundTrip(self.target.rtt)
        await self.trip.out()

    async def finish(self, outputs: list[SemanticVariable]) -> list[str]:
        values = await get_all(outputs)
        await self.trip.back()
        return values


def now() -> float:
    return time.perf_counter()


async def at(start: float, offset_s: float) -> None:
    """Sleep until `offset_s` after `start` (a `now()` value)."""
    delay = start + offset_s - now()
    if delay > 0:
        await asyncio.sleep(delay)


def salt_digits(salt: str) -> str:
    """Eight decimal digits from `salt` (sha256): distinct runs, the same length in tokens."""
    return f"{int(hashlib.sha256(salt.encode()).hexdigest(), 16) % 10**8:08d}"
