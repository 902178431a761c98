"""OpenAI `n`: one request for 8 choices against 8 separate requests, on the real model.

    python -m benchmarks.serving.openai_n [--n 8] [--prompt-words 900] [--max-tokens 16] [--reps 3]

Two managers over one builtin engine, each served on 127.0.0.1 (OS-picked port) and driven by the
official `openai` client: A sends one /v1/completions request with `n` (prefix sharing on, its
default: the prompt is filled once and each choice forks it); B sends `n` separate requests at once
to a manager with prefix sharing off (each fills the prompt). Every repetition uses a fresh prompt
(nothing cached from before); A and B alternate; medians are printed with the engine's prefill
counters (EngineStats.num_prefill_tokens) for each, and the machine (commit, CPU, load, torch).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai

from benchmarks.common.machine import machine_info
from parrot.backends.connect import connect_engine
from parrot.engine.async_engine import AsyncEngine
from parrot.engine.config import EngineConfig
from parrot.serve import ManagerConfig, create_app, create_manager
from parrot.serve.config import SharingConfig
from parrot.web.server_thread import ServerThread

WORDS = ["river", "harbor", "lantern", "meadow", "copper", "violet", "thunder", "orchard", "glacier", "saddle"]


def prompt(rng: random.Random, num_words: int) -> str:
    return "Story: " + " ".join(rng.choice(WORDS) for _ in range(num_words)) + "\nThe end of the story is"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt-words", type=int, default=900)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    engine = AsyncEngine(EngineConfig(model=args.model))
    engine.start()
    shared = ServerThread(create_app(create_manager([engine]), connect_engine=connect_engine), name="n-on")
    separate = ServerThread(
        create_app(
            create_manager([engine], config=ManagerConfig(sharing=SharingConfig(prefix_sharing=False))),
            connect_engine=connect_engine,
        ),
        name="n-off",
    )
    shared.start(timeout=120)
    separate.start(timeout=120)
    model = engine.model_name
    rng = random.Random(0)
    kw: dict[str, Any] = {
        "model": model,
        "max_tokens": args.max_tokens,
        "temperature": 1.0,
        "extra_body": {"ignore_eos": True},
    }
    rows: dict[str, list[tuple[float, int]]] = {"n": [], "separate": []}
    num_prompt_tokens = 0

    def prefill() -> int:
        return engine.engine.stats().num_prefill_tokens

    try:
        c_on = openai.OpenAI(base_url=shared.url + "/v1", api_key="k", max_retries=0, timeout=600)
        c_off = openai.OpenAI(base_url=separate.url + "/v1", api_key="k", max_retries=0, timeout=600)
        c_on.completions.create(prompt="warm up", **kw)  # first-call costs (kernels, threads) out of the timing
        with ThreadPoolExecutor(args.n) as pool:
            for rep in range(args.reps):
                for kind in ["n", "separate"] if rep % 2 == 0 else ["separate", "n"]:
                    text = prompt(rng, args.prompt_words)
                    before, t0 = prefill(), time.perf_counter()
                    if kind == "n":
                        got = c_on.completions.create(prompt=text, n=args.n, **kw)
                        assert len(got.choices) == args.n
                        num_prompt_tokens = got.usage.prompt_tokens if got.usage else 0
                    else:
                        list(pool.map(lambda p: c_off.completions.create(prompt=p, **kw), [text] * args.n))
                    rows[kind].append((time.perf_counter() - t0, prefill() - before))
    finally:
        shared.stop()
        separate.stop()
        engine.stop()
    med = {k: statistics.median(t for t, _ in v) for k, v in rows.items()}
    result = {
        "n": args.n,
        "prompt_tokens": num_prompt_tokens,
        "max_tokens": args.max_tokens,
        "seconds": {k: [round(t, 3) for t, _ in v] for k, v in rows.items()},
        "prefill_tokens": {k: [p for _, p in v] for k, v in rows.items()},
        "median_s": {k: round(v, 3) for k, v in med.items()},
        "speedup": round(med["separate"] / med["n"], 2),
        "load_avg_1min_before_after": [load_before, os.getloadavg()[0]],
        "machine": machine_info(),
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
