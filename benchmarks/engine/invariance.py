"""Batch invariance on the real model: does a chat's output depend on what else runs?

    python -m benchmarks.engine.invariance [--no-batch-invariant [--attention paged]]

32 chat prompts of different lengths (one shared ~700-token system prompt), bf16 by default. Each prompt
runs alone (one fill, then generate), then all 32 run at once: (1) each filled in one piece, and
(2) each forked from one shared context holding the system prompt (prefix sharing). Greedy and
seeded sampling. Prints, per comparison, how many of the 32 outputs are identical to the alone run:
same tokens, and same tokens with bit-equal logprobs.
"""

from __future__ import annotations

import argparse
import time

import torch

from parrot.engine import sync_client
from parrot.engine.config import EngineConfig
from parrot.engine.llm_engine import LLMEngine
from parrot.protocol import ExtendRequest, FreeContextRequest, SamplingParams

RULES = [
    "Answer in plain sentences and define any technical word the first time you use it.",
    "Give one concrete example when it helps, taken from everyday life where possible.",
    "Say so when you are not sure, and say what would settle the question.",
    "Keep answers short unless the question asks for detail; never pad an answer.",
    "Prefer numbers with units over vague words such as many, large or soon.",
    "When a question has a common misconception behind it, name the misconception gently.",
]
# Long enough (~700 tokens) that forked chats share a prefix the shared-prefix cascade attends once.
SYSTEM = "You are a careful assistant for students. " + " ".join(
    f"Rule {i + 1}: {RULES[i % len(RULES)]}" for i in range(36)
)
TOPICS = [
    "the water cycle",
    "photosynthesis",
    "how a bicycle stays upright",
    "why the sky is blue",
    "compound interest",
    "the French revolution",
    "how vaccines work",
    "black holes",
    "the stock market",
    "plate tectonics",
    "how a refrigerator works",
    "the immune system",
    "machine learning",
    "the printing press",
    "volcanoes",
    "how airplanes fly",
    "the moon's phases",
    "recycling plastic",
    "the Roman empire",
    "how batteries store energy",
    "the human heart",
    "climate and weather",
    "prime numbers",
    "the internet",
    "honey bees",
    "ocean tides",
    "how a compiler works",
    "the Renaissance",
    "electric cars",
    "sleep",
    "coffee",
    "the periodic table",
]

Output = tuple[list[int], list[float]]


def prompts(engine: LLMEngine) -> tuple[list[int], list[list[int]]]:
    """(the shared system-prompt tokens, each prompt's remaining tokens); lengths differ by prompt."""
    tok = engine.tokenizer
    system = tok.apply_chat_template([{"role": "system", "content": SYSTEM}], add_generation_prompt=False)
    prefix = tok.encode(system)
    suffixes = []
    for i, topic in enumerate(TOPICS):
        detail = " Then list three related questions a student might ask." * (i % 4)
        text = tok.apply_chat_template(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Explain {topic}.{detail}"}]
        )
        ids = tok.encode(text)
        assert ids[: len(prefix)] == prefix, "the system prompt must tokenize to a prefix of every prompt"
        suffixes.append(ids[len(prefix) :])
    return prefix, suffixes


def outputs(events: list) -> Output:
    return [e.token_id for e in events if e.token_id is not None], [e.logprob for e in events if e.logprob is not None]


def run_alone(
    engine: LLMEngine, prefix: list[int], suffixes: list[list[int]], sp: list[SamplingParams]
) -> list[Output]:
    outs = []
    for i, suffix in enumerate(suffixes):
        sync_client.extend_only(engine, ExtendRequest(context_id="alone", token_ids=prefix + suffix))
        outs.append(outputs(sync_client.extend(engine, ExtendRequest(context_id="alone", append=True, sampling=sp[i]))))
        engine.free(FreeContextRequest(context_id="alone"))
    return outs


def run_together(
    engine: LLMEngine, prefix: list[int], suffixes: list[list[int]], sp: list[SamplingParams], fork: bool
) -> list[Output]:
    if fork:
        sync_client.extend_only(engine, ExtendRequest(context_id="system", token_ids=prefix))
    handles = []
    for i, suffix in enumerate(suffixes):
        cid = f"c{i}"
        fill = ExtendRequest(context_id=cid, token_ids=suffix, parent_context_id="system")
        if not fork:
            fill = ExtendRequest(context_id=cid, token_ids=prefix + suffix)
        sync_client.submit(engine, fill)
        handles.append(sync_client.submit(engine, ExtendRequest(context_id=cid, append=True, sampling=sp[i])))
    outs = [outputs(sync_client.wait(h)) for h in handles]
    for i in range(len(suffixes)):
        engine.free(FreeContextRequest(context_id=f"c{i}"))
    if fork:
        engine.free(FreeContextRequest(context_id="system"))
    return outs


def check(engine: LLMEngine, max_tokens: int) -> dict[str, int]:
    """Run every comparison on `engine`, print each, and return {comparison: identical of 32}."""
    n = len(TOPICS)
    prefix, suffixes = prompts(engine)
    modes = {
        "greedy": [SamplingParams(max_tokens=max_tokens, ignore_eos=True)] * n,
        "seeded": [
            SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.8, top_p=0.95, seed=i)
            for i in range(n)
        ],
    }
    results = {}
    for mode, sp in modes.items():
        t0 = time.perf_counter()
        alone = run_alone(engine, prefix, suffixes, sp)
        for fork in (False, True):
            together = run_together(engine, prefix, suffixes, sp, fork)
            same_tokens = sum(x[0] == y[0] for x, y in zip(alone, together, strict=True))
            same_bits = sum(x == y for x, y in zip(alone, together, strict=True))
            how = "forked from a shared system prompt" if fork else "each filled in one piece"
            print(
                f"{mode}: alone vs {n} concurrent, {how}: {same_tokens}/{n} identical tokens, "
                f"{same_bits}/{n} bit-equal logprobs",
                flush=True,
            )
            results[f"{mode}, {'forked' if fork else 'one fill'}"] = same_tokens
        print(f"  ({mode}: {time.perf_counter() - t0:.0f} s)", flush=True)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--batch-invariant", action=argparse.BooleanOptionalAction, default=EngineConfig.batch_invariant)
    ap.add_argument("--attention", default=EngineConfig.attention)
    ap.add_argument("--cpu-kernels", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    config = EngineConfig(
        model=a.model,
        dtype=a.dtype,
        attention=a.attention,
        cpu_kernels=a.cpu_kernels,
        batch_invariant=a.batch_invariant,
    )
    engine = LLMEngine(config)
    engine.start()
    stats = engine.stats()
    print(
        f"{a.model} {a.dtype}, attention {engine.runner.backend.name}, kernels {stats.native_kernels}, "
        f"batch_invariant={engine.batch_invariant}, {len(TOPICS)} prompts, {a.max_tokens} tokens each"
    )
    try:
        check(engine, a.max_tokens)
    finally:
        engine.stop()


if __name__ == "__main__":
    main()
