"""Chat mixed with map-reduce (the paper's Fig. 18): a steady stream of chat requests (a person
waits on each) shares the engine with map-reduce apps that arrive in bursts (nobody waits on
their maps, only on the final summary).

Chat is request-level traffic in every configuration (one call, one round trip); the map-reduce
apps are Parrot SDK apps or request-level clients. A latency-centric engine keeps chat fast but
slows the maps; a throughput-centric one does the opposite; Parrot's objective deduction should
get both. Metrics: chat normalized latency (ms per output token) and map-reduce completion time.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from benchmarks.apps.scaling import Scale
from benchmarks.apps.workloads import map_reduce
from benchmarks.apps.workloads.common import Corpus, Metric, Outcome, Scenario, Target, at, now
from parrot.text import Tokenizer

NAME = "mixed"
CHAT = Metric("chat_norm_latency_ms", "chat normalized latency", "ms/token")
MAP_REDUCE = Metric("map_reduce_jct_s", "map-reduce completion time", "s")
SEED = 18


@dataclass(frozen=True)
class Params:
    num_chat: int
    chat_rate: float
    chat_max_prompt_tokens: int
    chat_min_output: int
    chat_max_output: int
    chat_output_factor: float  # output tokens = recorded reply tokens x this, clamped
    map_reduce: map_reduce.Params
    app_starts_s: tuple[float, ...]


def scenarios(scale: Scale, paper: dict) -> list[Scenario]:
    shape = paper["mixed_chat_map_reduce"]
    starts = [scale.mixed_start_s]
    for i in range(scale.mixed_apps - 1):
        starts.append(starts[-1] + scale.mixed_gaps_s[i % len(scale.mixed_gaps_s)])
    mr = map_reduce.Params(scale.chunk_tokens[0], scale.output_tokens[0], scale.num_chunks)
    params = Params(
        scale.chat_requests,
        scale.chat_rate,
        scale.chat_max_prompt_tokens,
        scale.min_output,
        scale.max_output,
        scale.output_factor,
        mr,
        tuple(starts),
    )
    scaling = (
        f"{params.num_chat} ShareGPT chats at {params.chat_rate:g}/s, prompts <= {params.chat_max_prompt_tokens} "
        "tokens, "
        f"outputs = recorded reply length / {round(1 / scale.output_factor)} clamped to {scale.min_output}-"
        f"{scale.max_output} (paper: {shape['chat']['requests']} chats, recorded lengths); {scale.mixed_apps} "
        f"map-reduce apps of {mr.num_chunks} x {mr.chunk_tokens} tokens starting at {list(params.app_starts_s)} s "
        f"(paper: {shape['map_reduce']['apps']} apps of 1024-token chunks from 15 s)"
    )
    metrics = (CHAT, MAP_REDUCE)
    scenario = Scenario(
        NAME,
        f"{NAME}/default",
        "chat + map-reduce",
        params,
        metrics,
        "mixed",
        run,
        scaling,
        (),
        ("objective", "policy"),
    )
    return [scenario]


def chat_prompts(params: Params, corpus: Corpus) -> list[tuple[str, int]]:
    """(chat-formatted prompt, output tokens) of every chat request. The user's message starts with
    the run's salt (Corpus.salted), as every other text piece does: without it, the same chats in
    every run were served from the prefix cache of an earlier run or of a configuration sharing
    the server (measured unsalted: (d) vLLM computed 384 fewer prompt tokens than Parrot+vLLM,
    which ran before it on that vLLM)."""
    turns = corpus.chat_turns(params.num_chat, SEED, params.chat_max_prompt_tokens)
    tokenizer: Tokenizer = corpus.tokenizer
    out = []
    for t in turns:
        message = {"role": "user", "content": corpus.salt_prefix + t.prompt}
        prompt = tokenizer.apply_chat_template([message], add_generation_prompt=True)
        length = max(
            params.chat_min_output, min(params.chat_max_output, round(t.reply_len * params.chat_output_factor))
        )
        out.append((prompt, length))
    return out


async def run(params: Params, target: Target, corpus: Corpus) -> Outcome:
    chats = chat_prompts(params, corpus)
    mr = params.map_reduce
    docs = corpus.documents(4 + len(params.app_starts_s), mr.chunk_tokens * mr.num_chunks)[4:]
    chunk_lists = [corpus.chunks(d, mr.chunk_tokens, mr.num_chunks) for d in docs]
    start = now()

    async def chat(i: int, prompt: str, max_tokens: int) -> float:
        client = target.stream(f"chat/{i}").request_client()  # its round trip whatever the apps draw
        await at(start, i / params.chat_rate)
        begin = now()
        await client.complete(prompt, max_tokens)
        return (now() - begin) * 1000.0 / max_tokens

    async def app(j: int, offset: float, chunks: list[str]) -> float:
        own = target.stream(f"app/{j}")
        await at(start, offset)
        if target.is_parrot:
            return await map_reduce.parrot_app(mr, own, chunks)
        return await map_reduce.baseline_app(mr, own, chunks)

    chat_tasks = [chat(i, p, n) for i, (p, n) in enumerate(chats)]
    app_tasks = [
        app(j, offset, chunks) for j, (offset, chunks) in enumerate(zip(params.app_starts_s, chunk_lists, strict=True))
    ]
    results = await asyncio.gather(*chat_tasks, *app_tasks)
    norms, jcts = results[: len(chat_tasks)], results[len(chat_tasks) :]
    num_apps = len(app_tasks)
    return Outcome(
        {"chat_norm_latency_ms": sum(norms) / len(norms), "map_reduce_jct_s": sum(jcts) / num_apps},
        len(chats) + num_apps * (mr.num_chunks + 1),
        sum(n for _, n in chats) + num_apps * (mr.num_chunks + 1) * mr.output_tokens,
        {"chat_norm_latency_ms": list(norms), "map_reduce_jct_s": list(jcts)},
    )
