"""Chain summary (the paper's Fig. 10-12): summarize a long document chunk by chunk, each step
refining the summary so far with the next chunk, so step i depends on step i-1.

Parrot submits the whole chain at once (each refine reads the previous output variable, so the
manager runs it the moment its producer finishes); the request-level client renders each refine
prompt after the previous answer came back, paying a round trip per step. Variants: one app alone,
many apps at once (each on its own document; mean completion time), and one app with a Poisson
stream of unrelated background requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass

from benchmarks.apps.baselines import Networked, render_prompt
from benchmarks.apps.scaling import Scale
from benchmarks.apps.workloads.common import (
    Corpus,
    Metric,
    Outcome,
    Scenario,
    Stage,
    Target,
    now,
    schedule_seed,
    semantic,
)

NAME = "chain_summary"

FIRST = (
    "Write a one-sentence summary of the following text.\n\nText: {{input:chunk}}\n\n"
    "One-sentence summary:{{output:summary}}"
)
REFINE = (
    "The summary so far: {{input:summary}}\n\nRefine the summary with the next part of the text.\n\n"
    "Text: {{input:chunk}}\n\nRefined summary:{{output:refined}}"
)
BACKGROUND = "Continue the following text.\n\n{{input:text}}{{output:continuation}}"

JCT = Metric("jct_s", "completion time", "s")
MEAN_JCT = Metric("mean_jct_s", "mean completion time", "s")


@dataclass(frozen=True)
class Params:
    chunk_tokens: int
    output_tokens: int
    num_chunks: int
    num_apps: int = 1
    background_rate: float = 0.0  # requests/s of unrelated 512-token (scaled) prompts
    background_prompt_tokens: int = 64
    background_output_tokens: int = 25
    draw: int = 0  # the background arrivals' (Scenario.params_for: the repeat)


def scenarios(scale: Scale, paper: dict) -> list[Scenario]:
    shape = paper[NAME]
    ct0, out0 = scale.chunk_tokens[0], scale.output_tokens[0]

    def how(num_chunks: int, ct: int, out_len: int) -> str:
        return (
            f"{num_chunks} chunks of {ct} tokens (paper: {shape['chunk_tokens']}, default "
            f"{shape['default']['chunk_tokens']}, documents of 20k+ tokens), {out_len} output tokens "
            f"(paper: {shape['output_tokens']})"
        )

    def chain(key: str, label: str, params: Params, plots: tuple, ablations: tuple[str, ...] = ()) -> Scenario:
        scaling = how(params.num_chunks, params.chunk_tokens, params.output_tokens)
        return Scenario(NAME, f"{NAME}/{key}", label, params, (JCT,), "chain_summary", run, scaling, plots, ablations)

    sweep_out = len(scale.output_tokens) > 1
    sweep_chunk = len(scale.chunk_tokens) > 1
    plots: list[tuple[str, str, float]] = []
    if sweep_out:
        plots.append(("chain_output", "output tokens", float(out0)))
    if sweep_chunk:
        plots.append(("chain_chunk", "chunk tokens", float(ct0)))
    out = [chain("alone", "chain summary", Params(ct0, out0, scale.num_chunks), tuple(plots), ("dag", "early_fill"))]
    for out_len in scale.output_tokens[1:]:
        params = Params(ct0, out_len, scale.num_chunks)
        out.append(
            chain(
                f"out{out_len}",
                f"chain summary, {out_len} out",
                params,
                (("chain_output", "output tokens", float(out_len)),),
            )
        )
    for ct in scale.chunk_tokens[1:]:
        params = Params(ct, out0, scale.num_chunks)
        out.append(
            chain(f"chunk{ct}", f"chain summary, chunk {ct}", params, (("chain_chunk", "chunk tokens", float(ct)),))
        )
    for rate in scale.background_rates:
        params = Params(
            ct0,
            out0,
            scale.num_chunks,
            background_rate=rate,
            background_prompt_tokens=scale.prompt_len(512),
            background_output_tokens=scale.output_len(50),
        )
        plot = (("chain_background", "background requests/s", rate),)
        out.append(chain(f"bg{rate:g}", f"chain summary + background {rate:g}/s", params, plot))
    many = shape["many_apps"]
    for n in scale.many_apps:
        params = Params(ct0, out0, scale.many_apps_chunks, num_apps=n)
        scaling = (
            f"{n} apps at once (paper: {many['apps']}), {scale.many_apps_chunks} chunks of {ct0} tokens "
            f"(paper: {many['chunk_tokens']}), {out0} output tokens (paper: {many['output_tokens']})"
        )
        plots_many = (("chain_many", "number of apps", float(n)),) if len(scale.many_apps) > 1 else ()
        out.append(
            Scenario(
                NAME,
                f"{NAME}/many{n}",
                f"{n} chain apps at once",
                params,
                (MEAN_JCT,),
                "many_chain_apps",
                run,
                scaling,
                plots_many,
                ablations=("dag", "policy"),
            )
        )
    return out


async def run(params: Params, target: Target, corpus: Corpus) -> Outcome:
    docs = corpus.documents(max(params.num_apps, 2), params.chunk_tokens * params.num_chunks)
    chunk_lists = [corpus.chunks(d, params.chunk_tokens, params.num_chunks) for d in docs[: params.num_apps]]
    app = _parrot_app if target.is_parrot else _baseline_app
    stop = asyncio.Event()
    background = None
    if params.background_rate > 0:
        background = asyncio.create_task(
            _background(params, target.stream("background").request_client(), corpus, stop)
        )
    try:  # each chain its own round trips (RttSampler.stream), the same in every configuration
        jcts = await asyncio.gather(
            *(app(params, target.stream(f"app/{k}"), chunks) for k, chunks in enumerate(chunk_lists))
        )
    finally:
        stop.set()
    num_bg = await background if background is not None else 0
    num_calls = params.num_apps * params.num_chunks
    metrics = {"jct_s": jcts[0], "mean_jct_s": sum(jcts) / len(jcts)}
    return Outcome(
        metrics,
        num_calls + num_bg,
        num_calls * params.output_tokens + num_bg * params.background_output_tokens,
        {"jct_s": list(jcts), "background_requests": num_bg},
    )


async def _parrot_app(params: Params, target: Target, chunks: list[str]) -> float:
    first = semantic("first", FIRST, ["chunk"], "summary", params.output_tokens)
    refine = semantic("refine", REFINE, ["summary", "chunk"], "refined", params.output_tokens)
    start = now()
    async with target.session() as session:
        stage = Stage(target)
        await stage.start()
        summary = first.invoke(session.core, chunks[0])
        for chunk in chunks[1:]:
            await stage.barrier([summary])
            summary = refine.invoke(session.core, summary, chunk)
        await stage.finish([summary])
        end = now()
    return end - start


async def _baseline_app(params: Params, target: Target, chunks: list[str]) -> float:
    client = target.request_client()
    start = now()
    summary = await _call(client, FIRST, {"chunk": chunks[0]}, params.output_tokens)
    for chunk in chunks[1:]:
        summary = await _call(client, REFINE, {"summary": summary, "chunk": chunk}, params.output_tokens)
    return now() - start


async def _call(client: Networked, template: str, values: dict[str, str], max_tokens: int) -> str:
    return (await client.complete(render_prompt(template, values), max_tokens)).text


async def _background(params: Params, client: Networked, corpus: Corpus, stop: asyncio.Event) -> int:
    """Poisson arrivals of unrelated requests until `stop`; returns how many were sent (all awaited)."""
    rng = random.Random(schedule_seed(f"{NAME}/background/{params.background_rate}", params.draw))
    doc = corpus.documents(4, 4096)[-1]
    ids = corpus.document_ids(doc)
    tasks: list[asyncio.Task[str]] = []
    while not stop.is_set():
        offset = rng.randrange(0, len(ids) - params.background_prompt_tokens)
        text = corpus.text(ids[offset : offset + params.background_prompt_tokens])
        prompt = render_prompt(BACKGROUND, {"text": text})
        tasks.append(asyncio.create_task(_text(client, prompt, params.background_output_tokens)))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), rng.expovariate(params.background_rate))
    await asyncio.gather(*tasks)
    return len(tasks)


async def _text(client: Networked, prompt: str, max_tokens: int) -> str:
    return (await client.complete(prompt, max_tokens)).text
