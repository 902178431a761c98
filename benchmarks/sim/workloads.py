"""The paper's workloads (shared/workloads/paper_workloads.json) at full scale, as DAGs of calls
for `cluster.run_app`. Each `run_*` takes a started `Cluster`, a round-trip sampler, the word
generator and its parameters, and returns its metrics (seconds, ms per token).

Where the JSON leaves a shape open, the choice is stated here: documents are synthetic text of
the paper's lengths (10 documents of 20k-53k tokens, mean 31.8k); the copilot's shared prompt is
6,000 tokens (the paper says "thousands"); multi-agent rounds share the round's prefix (the
architect's design plus constant text up to the round's shared length); chat turns of the mixed
workload are drawn (prompt 4-1024 tokens, prompt + output <= 2048) by a seeded RNG.

The comparison with the real CPU benchmark (benchmarks/sim/vs_cpu.py) passes the real scenarios'
shapes instead: the GPTs arrival schedule and warm-up, the mixed workload's chat turns, and
`run_multi_agent_app`, the real multi-agent app built from its own templates (`template_call`).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any

from benchmarks.apps.workloads import multi_agent
from benchmarks.common.netsim import RttSampler
from benchmarks.sim.cluster import Call, Cluster, Input, Ref, now, run_app
from benchmarks.sim.words import Words
from parrot.protocol.template import Placeholder, PlaceholderKind, TextPiece, escape_text, parse_template

DOC_TOKENS = (20_000, 22_000, 24_000, 26_000, 28_000, 30_000, 33_000, 38_000, 44_000, 53_000)  # mean 31.8k


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def num_chunks_of(doc: int, chunk_tokens: int, num_chunks: int | None) -> int:
    """A document's chunks: its length over the chunk size, or `num_chunks` (scaled-down runs)."""
    return DOC_TOKENS[doc % len(DOC_TOKENS)] // chunk_tokens if num_chunks is None else num_chunks


def chain_calls(
    words: Words, doc: int, chunk_tokens: int, output_tokens: int, app: str = "", num_chunks: int | None = None
) -> list[Call]:
    n = num_chunks_of(doc, chunk_tokens, num_chunks)
    chunks = [words.text(f"doc{doc}/{chunk_tokens}/{i}", chunk_tokens) for i in range(n)]
    calls = [
        Call(
            ("Summarize this part of a paper in one sentence:", Input(chunks[0]), "\nSummary:"),
            f"{app}s0",
            output_tokens,
        )
    ]
    for i in range(1, n):
        pieces = (
            "Here is a summary so far:",
            Ref(f"{app}s{i - 1}"),
            "\nRefine it with the next part:",
            Input(chunks[i]),
            "\nRefined summary:",
        )
        calls.append(Call(pieces, f"{app}s{i}", output_tokens))
    return calls


def map_reduce_calls(
    words: Words, doc: int, chunk_tokens: int, output_tokens: int, app: str = "", num_chunks: int | None = None
) -> list[Call]:
    n = num_chunks_of(doc, chunk_tokens, num_chunks)
    calls = [
        Call(
            (
                "Summarize this part of a paper:",
                Input(words.text(f"doc{doc}/{chunk_tokens}/{i}", chunk_tokens)),
                "\nSummary:",
            ),
            f"{app}m{i}",
            output_tokens,
        )
        for i in range(n)
    ]
    pieces: list[str | Ref | Input] = ["Combine these summaries into one:"]
    for i in range(n):
        pieces += ["\n-", Ref(f"{app}m{i}")]
    calls.append(Call((*pieces, "\nFinal summary:"), f"{app}r", output_tokens))
    return calls


async def run_chain(
    cluster: Cluster,
    rtt: RttSampler,
    words: Words,
    docs: int,
    chunk_tokens: int,
    output_tokens: int,
    background_rate: float = 0.0,
    num_chunks: int | None = None,
) -> dict[str, float]:
    """Chain summaries of `docs` documents one after another (mean completion time); with a
    background Poisson stream of 512-token prompts (50 outputs) at `background_rate` per second."""
    stop = asyncio.Event()
    background = (
        asyncio.create_task(_background(cluster, rtt, words, background_rate, stop)) if background_rate else None
    )
    times = []
    for doc in range(docs):
        calls = chain_calls(words, doc, chunk_tokens, output_tokens, num_chunks=num_chunks)
        times.append((await run_app(cluster, calls, [calls[-1].output], rtt)).latency_s)
    stop.set()
    if background is not None:
        await background
    return {"jct_s": mean(times)}


async def _background(cluster: Cluster, rtt: RttSampler, words: Words, rate: float, stop: asyncio.Event) -> None:
    rng = random.Random(f"background{rate}")
    tasks = []
    i = 0
    while not stop.is_set():
        await asyncio.sleep(rng.expovariate(rate))
        call = Call(("Answer:", Input(words.text(f"bg{i}", 512))), f"bg{i}", 50)
        tasks.append(asyncio.create_task(run_app(cluster, [call], [call.output], rtt)))
        i += 1
    await asyncio.gather(*tasks)


async def run_many_chains(
    cluster: Cluster,
    rtt: RttSampler,
    words: Words,
    apps: int,
    chunk_tokens: int,
    output_tokens: int,
    num_chunks: int | None = None,
) -> dict[str, float]:
    """`apps` chain summaries started together, each on its own document: mean completion time."""
    runs = [chain_calls(words, i, chunk_tokens, output_tokens, f"a{i}.", num_chunks) for i in range(apps)]
    results = await asyncio.gather(*(run_app(cluster, calls, [calls[-1].output], rtt) for calls in runs))
    return {"mean_jct_s": mean([r.latency_s for r in results])}


async def run_map_reduce(
    cluster: Cluster,
    rtt: RttSampler,
    words: Words,
    docs: int,
    chunk_tokens: int,
    output_tokens: int,
    num_chunks: int | None = None,
) -> dict[str, float]:
    times = []
    for doc in range(docs):
        calls = map_reduce_calls(words, doc, chunk_tokens, output_tokens, num_chunks=num_chunks)
        times.append((await run_app(cluster, calls, [calls[-1].output], rtt)).latency_s)
    return {"jct_s": mean(times)}


@dataclass(frozen=True)
class GptsApp:
    name: str
    prompt_tokens: int
    query_tokens: int
    output_tokens: int


async def run_gpts(
    cluster: Cluster,
    rtt: RttSampler,
    words: Words,
    apps: list[dict[str, Any]],
    rate: float,
    num_requests: int,
    schedule: list[tuple[float, int]] | None = None,
    warm: bool = False,
) -> dict[str, float]:
    """Poisson arrivals at `rate`, apps mixed 1:1:1:1 (or `schedule`: (arrival offset s, app index)
    per request); normalized latency = mean(latency / output tokens). `warm`: each app answers one
    query before the clock starts (steady state, as the real benchmark measures)."""
    specs = [GptsApp(a["app_name"], a["prompt_length"], a["query_length"], a["output_length"]) for a in apps]
    prompts = {a.name: words.text(f"gpts/{a.name}", a.prompt_tokens) for a in specs}
    if schedule is None:
        rng, t, schedule = random.Random(f"gpts{rate}"), 0.0, []
        for i in range(num_requests):
            schedule.append((t, i % len(specs)))
            t += rng.expovariate(rate)

    def call(app: GptsApp, key: str) -> Call:
        query = Input(words.text(f"q{key}", app.query_tokens))
        return Call((prompts[app.name] + "\nUser:", query, "\nAssistant:"), f"g{key}", app.output_tokens)

    if warm:
        warm_calls = [call(app, f"warm{i}") for i, app in enumerate(specs)]
        await asyncio.gather(*(run_app(cluster, [c], [c.output], rtt) for c in warm_calls))
    start, tasks = now(), []
    for i, (offset, app_index) in enumerate(schedule):
        await asyncio.sleep(max(0.0, start + offset - now()))
        c = call(specs[app_index], str(i))
        tasks.append(asyncio.create_task(run_app(cluster, [c], [c.output], rtt)))
    results = await asyncio.gather(*tasks)
    norm = [r.latency_s * 1000 / specs[a].output_tokens for r, (_, a) in zip(results, schedule, strict=True)]
    return {"norm_latency_ms": mean(norm)}


def template_call(template: str, bind: dict[str, Ref | Input], output: str, max_tokens: int) -> Call:
    """A call from a real benchmark app's template (benchmarks/apps): its text, and each input
    placeholder bound to `bind[name]` (an earlier call's output, or a value); the template ends
    with its one output."""
    parsed = parse_template(template)
    *body, last = parsed.pieces
    assert isinstance(last, Placeholder) and last.kind is PlaceholderKind.OUTPUT, "the output must end the template"
    pieces = tuple(p.text if isinstance(p, TextPiece) else bind[p.name] for p in body)
    return Call(pieces, output, max_tokens)


async def run_multi_agent_app(
    cluster: Cluster, rtt: RttSampler, words: Words, params: multi_agent.Params
) -> dict[str, float]:
    """The real benchmark's multi-agent app (benchmarks/apps/multi_agent.py: its templates, rounds
    and outputs; every branch reads the project context, the design and the files' latest code and
    reviews, its role last), over a synthetic context of the same length."""
    templates = multi_agent.Templates(params, escape_text(words.text("ma/context", params.context_tokens)))
    calls: list[Call] = []
    state: dict[str, Ref | Input] = {}
    for k, r in enumerate(params.rounds):
        if r.role == "architect":
            calls.append(template_call(templates.architect(), {}, "design", r.output_tokens[0]))
            state["design"] = Ref("design")
            continue
        kind = "review" if r.role == "reviewer" else "code"
        outputs = {}
        for i in range(params.num_files):
            template, inputs = templates.branch(r.role, i, r.role == "reviser")
            calls.append(template_call(template, {n: state[n] for n in inputs}, f"r{k}f{i}", params.outs(r)[i]))
            outputs[f"{kind}{i}"] = Ref(f"r{k}f{i}")
        state.update(outputs)
    result = await run_app(cluster, calls, [c.output for c in calls[-params.num_files :]], rtt)
    return {"jct_s": result.latency_s}


async def run_multi_agent(
    cluster: Cluster,
    rtt: RttSampler,
    words: Words,
    spec: dict[str, Any],
    files: int,
    rounds: tuple[int, ...] = (1, 2, 3, 2, 3, 2, 3, 2, 3),
) -> dict[str, float]:
    """One architect call, then 10 rounds (0,1,2,3 then 2,3 three more times) of one call per file
    sharing the round's prefix (design + constant text); each file's call reads its previous one."""
    r0 = spec["round0"]
    calls = [
        Call(
            ("You are the architect. Design the program:" + words.text("ma/task", r0["prompt_tokens"]),),
            "design",
            r0["output_tokens"],
        )
    ]
    prev: dict[int, str] = {}
    for k, role_index in enumerate(rounds):
        role = spec["rounds"][role_index - 1]
        const = words.text(f"ma/{role['role']}", max(1, role["shared_prefix_tokens"] - r0["output_tokens"]))
        for f in range(files):
            suffix = role["suffix_tokens"][f % 2]
            pieces: list[str | Ref | Input] = [
                f"You are the {role['role']}." + const + "\nDesign:",
                Ref("design"),
                "\nFile:",
                Input(words.text(f"ma/{k}/{f}", suffix)),
            ]
            if f in prev:
                pieces += ["\nCurrent code:", Ref(prev[f])]
            out = f"r{k}f{f}"
            calls.append(Call((*pieces, "\nAnswer:"), out, role["output_tokens"][f % len(role["output_tokens"])]))
            prev[f] = out
    result = await run_app(cluster, calls, [prev[f] for f in range(files)], rtt)
    peak = max(e.counters.peak_blocks_used for e in cluster.engines) * cluster.setup.block_size
    return {"jct_s": result.latency_s, "peak_kv_tokens": float(peak)}


async def run_copilot(
    cluster: Cluster,
    rtt: RttSampler,
    words: Words,
    batch: int,
    prompt_tokens: int,
    query_tokens: int,
    output_tokens: int,
) -> dict[str, float]:
    """`batch` requests at once sharing one long system prompt: mean latency."""
    prompt = words.text("copilot/system", prompt_tokens)
    calls = [
        Call((prompt + "\nQuery:", Input(words.text(f"cq{i}", query_tokens)), "\nAnswer:"), f"q{i}", output_tokens)
        for i in range(batch)
    ]
    results = await asyncio.gather(*(run_app(cluster, [c], [c.output], rtt) for c in calls))
    return {"mean_latency_s": mean([r.latency_s for r in results])}


async def run_mixed(
    cluster: Cluster,
    rtt: RttSampler,
    words: Words,
    spec: dict[str, Any],
    turns: list[tuple[int, int]] | None = None,
) -> dict[str, float]:
    """Chats at 1 req/s (latency) and map-reduce apps from 15 s (throughput within each app).
    `turns`: (prompt tokens, output tokens) of each chat; default drawn by a seeded RNG."""
    chat, mr = spec["chat"], spec["map_reduce"]
    if turns is None:
        rng = random.Random("mixed/chat")
        turns = []
        for _ in range(chat["requests"]):
            prompt = rng.randint(4, chat.get("max_prompt_tokens", 1024))
            low, high = chat.get("output_tokens", (16, 512))
            turns.append((prompt, rng.randint(low, min(high, 2048 - prompt))))

    async def chats() -> list[float]:
        tasks = []
        for i, (prompt, out) in enumerate(turns):
            call = Call(("User:", Input(words.text(f"chat{i}", prompt)), "\nAssistant:"), f"chat{i}", out)
            tasks.append(asyncio.create_task(run_app(cluster, [call], [call.output], rtt)))
            await asyncio.sleep(1.0)
        results = await asyncio.gather(*tasks)
        return [r.latency_s * 1000 / out for r, (_, out) in zip(results, turns, strict=True)]

    async def map_reduces() -> list[float]:
        start = now()
        await asyncio.sleep(mr["start_after_s"])
        tasks = []
        for i, gap in enumerate(mr["gaps_s"][: mr["apps"]]):
            calls = map_reduce_calls(words, i, mr["chunk_tokens"], mr["output_tokens"], f"mr{i}.", mr.get("num_chunks"))
            tasks.append(asyncio.create_task(run_app(cluster, calls, [calls[-1].output], rtt)))
            await asyncio.sleep(gap)
        results = await asyncio.gather(*tasks)
        del start
        return [r.latency_s for r in results]

    chat_norm, mr_jct = await asyncio.gather(chats(), map_reduces())
    return {"chat_norm_latency_ms": mean(chat_norm), "map_reduce_jct_s": mean(mr_jct)}
