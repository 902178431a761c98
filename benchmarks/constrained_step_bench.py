"""What a JSON-schema constraint adds to a decode step at batch 32, on the real model.

    python -m benchmarks.constrained_step_bench [--batch 32] [--steps 24] [--reps 3]

The builtin engine is stepped in this thread (`LLMEngine.step`, loop stopped) with a step trace:
`--batch` generations of distinct ~60-token chat prompts, sampled (temperature 0.7, own seeds),
either plain or each constrained by a JSON schema whose string field keeps every row generating
(minLength), so all rows decode in every measured step. Plain and constrained alternate, `--reps`
times each; the median time of the steps where all rows decoded one token is printed for both,
with the overhead in percent, and the machine (commit, CPU, load, torch).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

from benchmarks.run import machine_info
from parrot.engine.config import EngineConfig
from parrot.engine.llm_engine import LLMEngine
from parrot.protocol import FreeContextRequest, GenerateRequest, SamplingParams

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 400, "maxLength": 2000},
        "rating": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["title", "rating"],
    "additionalProperties": False,
}


def run(engine: LLMEngine, tag: str, prompts: list[list[int]], steps: int, constrained: bool) -> list[float]:
    """Step times (ms) of the steps where every row decoded one token."""
    for i, ids in enumerate(prompts):
        sampling = SamplingParams(
            max_tokens=steps,
            temperature=0.7,
            seed=i,
            json_schema=SCHEMA if constrained else None,
            ignore_eos=not constrained,
        )
        engine.submit_generate(
            GenerateRequest(context_id=f"{tag}{i}", token_ids=ids, sampling=sampling), lambda e: None
        )
    engine.start_trace()
    while engine.step():
        pass
    trace = engine.stop_trace()
    for i in range(len(prompts)):
        engine.free_context(FreeContextRequest(context_id=f"{tag}{i}"))
    return [r.elapsed_s * 1000 for r in trace if r.num_decode == len(prompts) and r.num_prefill_tokens == 0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    engine = LLMEngine(EngineConfig(model=args.model))
    tok = engine.tokenizer
    prompts = [
        tok.encode(tok.apply_chat_template([{"role": "user", "content": f"Review book number {i} in detail."}]))
        for i in range(args.batch)
    ]
    engine.grammars.check(SamplingParams(json_schema=SCHEMA))  # the compiler's one-time setup, untimed
    times: dict[str, list[float]] = {"plain": [], "json_schema": []}
    for rep in range(args.reps):
        order = [False, True] if rep % 2 == 0 else [True, False]
        for constrained in order:
            key = "json_schema" if constrained else "plain"
            times[key] += run(engine, f"{key}{rep}-", prompts, args.steps, constrained)
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "batch": args.batch,
        "num_steps_measured": {k: len(v) for k, v in times.items()},
        "median_step_ms": {k: round(v, 2) for k, v in med.items()},
        "overhead_pct": round(100 * (med["json_schema"] / med["plain"] - 1), 1),
        "load_avg_1min_before_after": [load_before, os.getloadavg()[0]],
        "batch_invariant": engine.batch_invariant,
        "machine": machine_info(),
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
