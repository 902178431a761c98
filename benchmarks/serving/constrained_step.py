"""What a JSON-schema constraint adds to a decode step at batch 32, on the real model.

    python -m benchmarks.serving.constrained_step [--batch 32] [--steps 24] [--reps 3] [--schema typical|bounded]

The builtin engine is stepped in this thread (`LLMEngine.step`, loop stopped) with a step trace:
`--batch` generations of distinct ~60-token chat prompts, sampled (temperature 0.7, own seeds),
either plain or each constrained by a JSON schema that opens with a string field (`typical`: free
text; `bounded`: at least 400 characters, a worst case for the grammar's state). Only steps where
all rows decoded one token are measured (rows that finished early drop out of later steps).
Plain and constrained alternate, `--reps` times each; the median step time is printed for both,
with the overhead in percent, and the machine (commit, CPU, load, torch).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

from benchmarks.common.machine import machine_info
from parrot.engine.config import EngineConfig
from parrot.engine.llm_engine import LLMEngine
from parrot.protocol import ExtendRequest, FreeContextRequest, SamplingParams

SCHEMAS: dict[str, dict[str, Any]] = {
    # A free-text field first: rows keep generating while the model writes it.
    "typical": {
        "type": "object",
        "properties": {"review": {"type": "string"}, "rating": {"type": "integer", "minimum": 1, "maximum": 5}},
        "required": ["review", "rating"],
        "additionalProperties": False,
    },
    # A long bounded repetition (minLength 400): xgrammar's matcher state grows with the bound.
    "bounded": {
        "type": "object",
        "properties": {"review": {"type": "string", "minLength": 400, "maxLength": 2000}},
        "required": ["review"],
        "additionalProperties": False,
    },
}


def run(
    engine: LLMEngine, tag: str, prompts: list[list[int]], steps: int, schema: dict[str, Any] | None
) -> tuple[list[float], list[float]]:
    """Wall and CPU (this process, all threads) times in ms of the steps where every row decoded."""
    for i, ids in enumerate(prompts):
        sampling = SamplingParams(
            max_tokens=steps,
            temperature=0.7,
            seed=i,
            json_schema=schema,
            ignore_eos=schema is None,
        )
        engine.submit_extend(ExtendRequest(context_id=f"{tag}{i}", token_ids=ids, sampling=sampling), lambda e: None)
    engine.start_trace()
    cpu_ms = []
    while True:
        t0 = time.process_time()
        if not engine.step():
            break
        cpu_ms.append((time.process_time() - t0) * 1000)
    trace = engine.stop_trace()
    for i in range(len(prompts)):
        engine.free(FreeContextRequest(context_id=f"{tag}{i}"))
    full = [r.num_decode == len(prompts) and r.num_prefill_tokens == 0 for r in trace]
    return [r.elapsed_s * 1000 for r, f in zip(trace, full, strict=True) if f], [
        c for c, f in zip(cpu_ms, full, strict=True) if f
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--schema", choices=sorted(SCHEMAS), default="typical")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (1: CPU time is the work done)")
    args = ap.parse_args()
    schema = SCHEMAS[args.schema]
    load_before = os.getloadavg()[0]
    engine = LLMEngine(EngineConfig(model=args.model, num_threads=args.threads))
    tok = engine.tokenizer
    prompts = [
        tok.encode(tok.apply_chat_template([{"role": "user", "content": f"Review book number {i} in detail."}]))
        for i in range(args.batch)
    ]
    engine.grammars.check(SamplingParams(json_schema=schema))  # the compiler's one-time setup, untimed
    times: dict[str, list[float]] = {"plain": [], "json_schema": []}
    cpu: dict[str, list[float]] = {"plain": [], "json_schema": []}
    for rep in range(args.reps):
        order = [False, True] if rep % 2 == 0 else [True, False]
        for constrained in order:
            key = "json_schema" if constrained else "plain"
            wall, cpu_ms = run(engine, f"{key}{rep}-", prompts, args.steps, schema if constrained else None)
            times[key] += wall
            cpu[key] += cpu_ms
    med = {k: statistics.median(v) for k, v in times.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    result = {
        "batch": args.batch,
        "schema": args.schema,
        "num_steps_measured": {k: len(v) for k, v in times.items()},
        "median_step_ms": {k: round(v, 2) for k, v in med.items()},
        "overhead_pct": round(100 * (med["json_schema"] / med["plain"] - 1), 1),
        "median_step_cpu_ms": {k: round(v, 2) for k, v in med_cpu.items()},
        "cpu_overhead_pct": round(100 * (med_cpu["json_schema"] / med_cpu["plain"] - 1), 1),
        "torch_threads": args.threads,
        "load_avg_1min_before_after": [load_before, os.getloadavg()[0]],
        "batch_invariant": engine.batch_invariant,
        "machine": machine_info(),
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
