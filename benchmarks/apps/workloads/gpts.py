"""GPTs-style serving (the paper's Fig. 16): four applications, each a long system prompt, serve
short user queries arriving as a Poisson process at rising rates.

Every request is one call: the app's system prompt (constant template text, the same for all of
the app's requests, so the manager can share it as a prefix) followed by the user's query.
Metric: normalized latency, mean(latency / output tokens) in ms per token, against the rate.

Measured in steady state, as a deployed app is served: before the clock starts each app answers one
query (not measured), so its system prompt is in every prefix cache that keeps one (Parrot's, a
prefix-caching engine's); a configuration without prefix reuse computes it on every request anyway.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from benchmarks.apps.baselines import render_prompt
from benchmarks.apps.scaling import Scale
from benchmarks.apps.workloads.common import (
    Corpus,
    Metric,
    Outcome,
    Scenario,
    Target,
    at,
    literal,
    now,
    schedule_seed,
    semantic,
)

NAME = "gpts"
NORM = Metric("norm_latency_ms", "normalized latency", "ms/token")
SEED = 4
WARM_QUERY = "Hello, what can you do?"


@dataclass(frozen=True)
class App:
    name: str
    prompt_tokens: int
    query_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Params:
    apps: tuple[App, ...]
    rate: float  # requests/s
    num_requests: int
    draw: int = 0  # the arrival schedule's (Scenario.params_for: the repeat)


def scenarios(scale: Scale, paper: dict) -> list[Scenario]:
    shape = paper["gpts_serving"]
    apps = tuple(
        App(
            a["app_name"], scale.prompt_len(a["prompt_length"]), a["query_length"], scale.output_len(a["output_length"])
        )
        for a in shape["apps"]
    )
    scaling = (
        "system prompts "
        + "/".join(str(a.prompt_tokens) for a in apps)
        + " tokens (paper: "
        + "/".join(str(a["prompt_length"]) for a in shape["apps"])
        + "), outputs "
        + "/".join(str(a.output_tokens) for a in apps)
        + " (paper: "
        + "/".join(str(a["output_length"]) for a in shape["apps"])
        + f"), {scale.gpts_requests_per_rate} requests per rate, apps mixed 1:1:1:1"
    )
    return [
        Scenario(
            NAME,
            f"{NAME}/rate{rate:g}",
            f"GPTs serving, {rate:g} req/s",
            Params(apps, rate, scale.gpts_requests_per_rate),
            (NORM,),
            "gpts_serving",
            run,
            scaling,
            (("gpts", "request rate (req/s)", rate),),
            ("prefix", "policy") if rate == max(scale.gpts_rates) else (),
        )
        for rate in scale.gpts_rates
    ]


def templates(params: Params, corpus: Corpus) -> list[str]:
    prompts = corpus.system_prompts(len(params.apps), SEED)
    out = []
    for app, prompt in zip(params.apps, prompts, strict=True):
        text = prompt.text
        while corpus.num_tokens(text) < app.prompt_tokens:  # a short prompt is repeated to length
            text += "\n\n" + prompt.text
        system = corpus.truncate(text, app.prompt_tokens)
        out.append(f"{literal(system)}\n\nUser: {{{{input:query}}}}\nAssistant:{{{{output:answer}}}}")
    return out


def arrivals(params: Params) -> list[tuple[float, int]]:
    """(arrival offset s, app index) of every request; seeded by rate and draw, apps mixed 1:1:1:1
    in shuffled order."""
    rng = random.Random(schedule_seed(f"{NAME}/{params.rate}", params.draw))
    order = [i % len(params.apps) for i in range(params.num_requests)]
    rng.shuffle(order)
    t, out = 0.0, []
    for app in order:
        out.append((t, app))
        t += rng.expovariate(params.rate)
    return out


async def run(params: Params, target: Target, corpus: Corpus) -> Outcome:
    texts = templates(params, corpus)
    schedule = arrivals(params)
    turns = corpus.chat_turns(params.num_requests, SEED, 1024)
    queries = [
        corpus.truncate(t.prompt, params.apps[a].query_tokens) for t, (_, a) in zip(turns, schedule, strict=True)
    ]

    async def ask(app_index: int, query: str) -> None:
        app = params.apps[app_index]
        if target.is_parrot:
            fn = semantic(app.name.replace(" ", "_").lower(), texts[app_index], ["query"], "answer", app.output_tokens)
            await target.run_one(fn, query)
        else:
            prompt = render_prompt(texts[app_index], {"query": query})
            await target.request_client().complete(prompt, app.output_tokens)

    await asyncio.gather(*(ask(a, WARM_QUERY) for a in range(len(params.apps))))  # steady state
    start = now()

    async def one(i: int, offset: float, app_index: int) -> float:
        await at(start, offset)
        begin = now()
        await ask(app_index, queries[i])
        return (now() - begin) * 1000.0 / params.apps[app_index].output_tokens

    norms = await asyncio.gather(*(one(i, offset, a) for i, (offset, a) in enumerate(schedule)))
    # The engine also generated the warm-up's answers: the run's output check counts them.
    num_tokens = sum(params.apps[a].output_tokens for _, a in schedule) + sum(a.output_tokens for a in params.apps)
    return Outcome(
        {"norm_latency_ms": sum(norms) / len(norms), "max_norm_latency_ms": max(norms)},
        params.num_requests + len(params.apps),
        num_tokens,
        {"norm_latency_ms": list(norms)},
    )
