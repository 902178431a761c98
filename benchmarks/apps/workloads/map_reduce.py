"""Map-reduce summary (the paper's Fig. 13): summarize every chunk of a document independently
(the maps, a task group), then combine all the summaries in one reduce call.

Parrot submits the maps and the reduce at once; the reduce starts when the last map finishes, with
no round trip in between, and the maps (nobody waits on them directly) may be batched for
throughput. The request-level client sends the maps concurrently (LangChain's map-reduce chain
does), waits for all, renders the reduce prompt and sends it: two round trips on the critical path.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from benchmarks.apps.baselines import render_prompt
from benchmarks.apps.scaling import Scale
from benchmarks.apps.workloads.common import Corpus, Metric, Outcome, Scenario, Stage, Target, now, semantic
from parrot.frontend import SemanticFunction

NAME = "map_reduce"

MAP = (
    "Write a one-sentence summary of the following text.\n\nText: {{input:chunk}}\n\n"
    "One-sentence summary:{{output:summary}}"
)
JCT = Metric("jct_s", "completion time", "s")


def reduce_template(num_inputs: int) -> str:
    lines = "".join(f"Summary {i + 1}: {{{{input:s{i}}}}}\n" for i in range(num_inputs))
    return f"Combine the following summaries into one summary.\n\n{lines}\nCombined summary:{{{{output:final}}}}"


@dataclass(frozen=True)
class Params:
    chunk_tokens: int
    output_tokens: int
    num_chunks: int


def scenarios(scale: Scale, paper: dict) -> list[Scenario]:
    shape = paper["map_reduce_summary"]
    ct0, out0 = scale.chunk_tokens[0], scale.output_tokens[0]

    def scenario(key: str, label: str, params: Params, plots: tuple, ablations: tuple[str, ...] = ()) -> Scenario:
        scaling = (
            f"{params.num_chunks} maps over chunks of {params.chunk_tokens} tokens (paper: {shape['chunk_tokens']}, "
            f"documents of 20k+ tokens), {params.output_tokens} output tokens (paper: {shape['output_tokens']})"
        )
        return Scenario(NAME, f"{NAME}/{key}", label, params, (JCT,), "map_reduce", run, scaling, plots, ablations)

    plots: list[tuple[str, str, float]] = []
    if len(scale.output_tokens) > 1:
        plots.append(("map_reduce_output", "output tokens", float(out0)))
    if len(scale.chunk_tokens) > 1:
        plots.append(("map_reduce_chunk", "chunk tokens", float(ct0)))
    out = [
        scenario(
            "default", "map-reduce summary", Params(ct0, out0, scale.num_map_chunks), tuple(plots), ("dag", "objective")
        )
    ]
    for out_len in scale.output_tokens[1:]:
        params = Params(ct0, out_len, scale.num_map_chunks)
        plot = (("map_reduce_output", "output tokens", float(out_len)),)
        out.append(scenario(f"out{out_len}", f"map-reduce, {out_len} out", params, plot))
    for ct in scale.chunk_tokens[1:]:
        params = Params(ct, out0, scale.num_map_chunks)
        out.append(
            scenario(f"chunk{ct}", f"map-reduce, chunk {ct}", params, (("map_reduce_chunk", "chunk tokens", ct),))
        )
    return out


async def run(params: Params, target: Target, corpus: Corpus) -> Outcome:
    doc = corpus.documents(2, params.chunk_tokens * params.num_chunks)[1]
    chunks = corpus.chunks(doc, params.chunk_tokens, params.num_chunks)
    app = parrot_app if target.is_parrot else baseline_app
    jct = await app(params, target, chunks)
    num_calls = params.num_chunks + 1
    return Outcome({"jct_s": jct}, num_calls, num_calls * params.output_tokens)


def functions(params: Params) -> tuple[SemanticFunction, SemanticFunction]:
    inputs = [f"s{i}" for i in range(params.num_chunks)]
    return (
        semantic("map", MAP, ["chunk"], "summary", params.output_tokens),
        semantic("reduce", reduce_template(params.num_chunks), inputs, "final", params.output_tokens),
    )


async def parrot_app(params: Params, target: Target, chunks: list[str]) -> float:
    """One map-reduce app through the SDK; its completion time (s)."""
    map_fn, reduce_fn = functions(params)
    start = now()
    async with target.session() as session:
        stage = Stage(target)
        await stage.start()
        summaries = [map_fn.invoke(session.core, chunk) for chunk in chunks]
        await stage.barrier(summaries)
        final = reduce_fn.invoke(session.core, *summaries)
        await stage.finish([final])
        end = now()
    return end - start


async def baseline_app(params: Params, target: Target, chunks: list[str]) -> float:
    """One map-reduce app, request by request; its completion time (s)."""
    client = target.request_client()
    start = now()
    prompts = [render_prompt(MAP, {"chunk": chunk}) for chunk in chunks]
    maps = await asyncio.gather(*(client.complete(p, params.output_tokens) for p in prompts))
    values = {f"s{i}": m.text for i, m in enumerate(maps)}
    await client.complete(render_prompt(reduce_template(params.num_chunks), values), params.output_tokens)
    return now() - start
