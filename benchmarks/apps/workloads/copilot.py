"""Copilot-style serving (the paper's Fig. 15): many users' requests share one very long prompt
(the product's instructions and context) and differ only in a short suffix; all arrive at once.

The shared prompt is constant template text, so the manager can recognize it across sessions and
fill it once (when prefix sharing lands) and the engine can attend to it once per step for the
whole batch (shared-prefix attention). Metrics: mean request latency and the batch's completion.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from benchmarks.apps.baselines import render_prompt
from benchmarks.apps.scaling import Scale
from benchmarks.apps.workloads.common import Corpus, Metric, Outcome, Scenario, Target, literal, now, semantic

NAME = "copilot"
MEAN = Metric("mean_latency_s", "mean latency", "s")
BATCH = Metric("batch_s", "batch completion", "s")
SEED = 15


@dataclass(frozen=True)
class Params:
    prompt_tokens: int
    num_requests: int
    output_tokens: int
    query_tokens: int = 16


def scenarios(scale: Scale, paper: dict) -> list[Scenario]:
    params = Params(scale.copilot_prompt_tokens, scale.copilot_requests, scale.output_tokens[0])
    scaling = (
        f"one shared prompt of {params.prompt_tokens} tokens, {params.num_requests} requests at once with distinct "
        f"{params.query_tokens}-token suffixes, {params.output_tokens} output tokens (paper: prompts of thousands of "
        "tokens, up to 64 requests)"
    )
    key = f"{NAME}/n{params.num_requests}"
    label, paper_key = "copilot shared prompt", "copilot_shared_prompt"
    return [Scenario(NAME, key, label, params, (MEAN, BATCH), paper_key, run, scaling, (), ("prefix", "attention"))]


def template(params: Params, corpus: Corpus) -> str:
    doc = corpus.documents(4, params.prompt_tokens)[3]
    shared = corpus.truncate(doc.text, params.prompt_tokens)
    return (
        f"You are a writing assistant. The user is editing this document:\n\n{literal(shared)}\n\n"
        "The user asks: {{input:query}}\nAnswer:{{output:answer}}"
    )


async def run(params: Params, target: Target, corpus: Corpus) -> Outcome:
    text = template(params, corpus)
    turns = corpus.chat_turns(params.num_requests, SEED, 1024)
    queries = [corpus.truncate(t.prompt, params.query_tokens) for t in turns]
    start = now()

    async def one(query: str) -> float:
        if target.is_parrot:
            fn = semantic("copilot", text, ["query"], "answer", params.output_tokens)
            await target.run_one(fn, query)
        else:
            prompt = render_prompt(text, {"query": query})
            await target.request_client().complete(prompt, params.output_tokens)
        return now() - start

    latencies = await asyncio.gather(*(one(q) for q in queries))
    return Outcome(
        {"mean_latency_s": sum(latencies) / len(latencies), "batch_s": max(latencies)},
        params.num_requests,
        params.num_requests * params.output_tokens,
        {"latency_s": list(latencies)},
    )
