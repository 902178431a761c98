"""What streaming costs vLLM: the same concurrent requests sent whole (as the request-level client
sends them) and streamed as the OpenAI engine adapter streams them (`logprobs: 0` with token ids,
one chunk per token, or one chunk per `stream_interval` tokens), interleaved, median of the rounds.

    python -m benchmarks.stream_ab --requests 8 --prompt-tokens 256 --new-tokens 25 --rounds 3

On a 2-core machine vLLM's API server (SSE chunks, per-token logprobs) shares the cores with its
engine, so per-token streaming can slow the engine itself; this measures by how much.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from typing import Any

import httpx

from benchmarks.peers import random_prompts
from benchmarks.peers.vllm_server import VLLMServer, vllm_server, vocab_size_of

MODES = {
    "whole": {},
    "streamed": {"stream": True, "logprobs": 0, "return_tokens_as_token_ids": True},
    "streamed/8": {"stream": True, "logprobs": 0, "return_tokens_as_token_ids": True, "stream_interval": 8},
}


async def one(http: httpx.AsyncClient, server: VLLMServer, prompt: list[int], new_tokens: int, extra: dict) -> None:
    body: dict[str, Any] = {"model": server.model, "prompt": prompt, "max_tokens": new_tokens, "temperature": 0.0}
    body |= {"ignore_eos": True, **extra}
    if not extra.get("stream"):
        (await http.post("/v1/completions", json=body)).raise_for_status()
        return
    async with http.stream("POST", "/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if line.startswith("data:") and line.strip() != "data: [DONE]":
                json.loads(line[5:])


async def batch_s(server: VLLMServer, prompts: list[list[int]], new_tokens: int, extra: dict) -> float:
    limits = httpx.Limits(max_connections=len(prompts) + 4)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=600.0, limits=limits) as http:
        started = time.perf_counter()
        await asyncio.gather(*(one(http, server, p, new_tokens, extra) for p in prompts))
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--startup-s", type=float, default=1200.0)
    args = parser.parse_args()
    with vllm_server(startup_timeout_s=args.startup_s) as server:
        vocab = vocab_size_of(server.model_folder)
        times: dict[str, list[float]] = {m: [] for m in MODES}
        asyncio.run(batch_s(server, random_prompts(2, args.prompt_tokens, vocab, "ab/warm"), 4, {}))  # warm-up
        for r in range(args.rounds):
            order = list(MODES) if r % 2 == 0 else list(MODES)[::-1]
            for i, mode in enumerate(order):
                prompts = random_prompts(args.requests, args.prompt_tokens, vocab, f"ab/{r}/{i}")  # no cache hits
                times[mode].append(asyncio.run(batch_s(server, prompts, args.new_tokens, MODES[mode])))
        print(f"load {os.getloadavg()}; {args.requests} requests x {args.prompt_tokens} + {args.new_tokens} tokens")
        for mode, ts in times.items():
            print(f"{mode:>11}: median {statistics.median(ts):.2f} s (min {min(ts):.2f}, max {max(ts):.2f})")


if __name__ == "__main__":
    main()
