"""Where Parrot+vLLM's time per token goes on GPTs-like traffic: the same requests sent to one real
vLLM server whole (as the request-level client sends them), streamed as the engine adapter asks
(token ids, `logprobs: 0`, `priority`), and through Parrot's embedded manager over the adapter.

    python -m benchmarks.serving.vllm_paths --rounds 3     # vLLM set up by scripts/setup_vllm.sh

Also streamed in chunks of 16 tokens (the adapter's for a generation nobody watches), with the
ids under `logprobs: 0` (the adapter's where a reader wants logprobs) or as vLLM's
`return_token_ids` (no logprobs computed: the adapter's otherwise); and through the manager as if
a reader wanted the logprobs ("parrot, logprobs read"). Diagnostics of the manager's cost: its
heartbeats every 10 s instead of 0.5 ("parrot, heartbeat 10 s"), one streamed chunk per answer
("parrot, one chunk"), and the plain streamed ids with 5 ms of CPU spent in this process per
request ("ids, chunks of 16, 5 ms CPU": what a client-side ms costs the engine on shared cores);
and whole answers while a thread of this process spins `--burn-ms` of CPU every `--every-ms`
("whole, beside CPU bursts": the shape of a manager's work, short bursts as requests and chunks
arrive; vLLM's engine runs each step on every core, meeting at a barrier each layer, so a burst
on one core delays the whole step).

Each round sends `--requests` requests (a shared 930-token system prompt + a 20-token question,
32 output tokens) at `--rate` per second in every mode, modes interleaved; prints the median over
rounds of the mean latency per output token. Copilot's shape (one fresh 1,024-token prompt per
round, shared by 6 requests sent at once, 16-token questions, 25 output tokens):

    python -m benchmarks.serving.vllm_paths --requests 6 --rate 0 --system-tokens 1024 \
        --question-tokens 16 --output-tokens 25 --fresh-system --modes whole parrot

What streaming costs vLLM, requests sent at once without a shared prompt:

    python -m benchmarks.serving.vllm_paths --rate 0 --system-tokens 0 --question-tokens 256 \
        --output-tokens 25 --modes whole streamed "streamed, chunks of 16"
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import httpx

from benchmarks.peers import random_prompts
from benchmarks.peers.vllm_server import VLLMServer, vllm_server, vocab_size_of
from parrot.backends.openai_engine import OpenAIEngineClient
from parrot.protocol.public_api import CallSpec
from parrot.protocol.sampling import SamplingParams
from parrot.protocol.template import ParsedTemplate, Placeholder, PlaceholderKind, TextPiece
from parrot.serve import ManagerConfig, create_manager
from parrot.serve.config import EnginesConfig

STREAMED = {"stream": True, "logprobs": 0, "return_tokens_as_token_ids": True}
IDS = {"stream": True, "return_token_ids": True}  # vLLM's token ids without logprobs
RARE_HEARTBEATS = ManagerConfig(
    engines=EnginesConfig(heartbeat_interval_s=10.0, heartbeat_timeout_s=10.0, engine_dead_after_s=60.0)
)


def burn(ms: float) -> None:
    """Spin this thread for `ms` of CPU (what a client path might cost the engine's cores)."""
    end = time.thread_time() + ms / 1000
    while time.thread_time() < end:
        pass


class Burner:
    """A daemon thread that, while `on` is set, spins `burn_ms` of its own CPU every `every_ms`."""

    def __init__(self, burn_ms: float, every_ms: float) -> None:
        self.on = threading.Event()
        self._burn_s, self._every_s = burn_ms / 1000, every_ms / 1000
        threading.Thread(target=self._run, name="burner", daemon=True).start()

    def _run(self) -> None:
        while True:
            if self.on.is_set():
                start = time.thread_time()
                while time.thread_time() - start < self._burn_s:
                    pass
            time.sleep(self._every_s)


async def beside_bursts(burner: Burner, run: Coroutine[Any, Any, float]) -> float:
    """`run` while `burner` spins."""
    burner.on.set()
    try:
        return await run
    finally:
        burner.on.clear()


async def direct(
    server: VLLMServer, prompts: list[list[int]], gap_s: float, out: int, extra: dict[str, Any], cpu_ms: float = 0.0
) -> float:
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=server.base_url, timeout=600) as http:

        async def one(prompt: list[int], delay: float) -> None:
            await asyncio.sleep(delay)
            body = {"model": server.model, "prompt": prompt, "max_tokens": out, "temperature": 0.0, "ignore_eos": True}
            burn(cpu_ms)  # before the clock: the engine's time, not the burn's, is measured
            start = time.perf_counter()
            if extra.get("stream"):
                async with http.stream("POST", "/v1/completions", json=body | extra) as resp:
                    async for _ in resp.aiter_lines():
                        pass
            else:
                (await http.post("/v1/completions", json=body | extra)).raise_for_status()
            latencies.append(time.perf_counter() - start)

        await asyncio.gather(*(one(p, i * gap_s) for i, p in enumerate(prompts)))
    return 1000 * statistics.mean(latencies) / out


async def via_parrot(
    server: VLLMServer,
    prompts: list[list[int]],
    gap_s: float,
    out: int,
    interval: int = 1,
    logprobs: bool = False,
    config: ManagerConfig | None = None,
) -> float:
    """Through the manager over the adapter; `logprobs`: as if a reader wanted the tokens' logprobs
    (an OpenAI request with `logprobs`): vLLM computes them, the SDK's calls do not ask."""
    client = OpenAIEngineClient(
        server.base_url, server.model, tokenizer_folder=server.model_folder, stream_interval=interval
    )
    manager = create_manager([client], config=config or ManagerConfig())
    await manager.start()
    latencies: list[float] = []
    template = ParsedTemplate((TextPiece("x"), Placeholder("o", PlaceholderKind.OUTPUT)), (), ("o",))
    sampling = SamplingParams(max_tokens=out, ignore_eos=True, temperature=0.0)
    try:

        async def one(prompt: list[int], delay: float) -> None:
            await asyncio.sleep(delay)
            created = manager.create_session("bench")
            session = manager.session(created.session_id, created.token)
            spec = CallSpec(template="x", sampling={"o": sampling}, model=manager.pool.models[0])
            start = time.perf_counter()
            (node,) = manager.submit_parsed(session, [spec], template, (), prompt)  # a plain request, as tokens
            session.graph.variables[node.outputs["o"]].logprobs_read = logprobs  # before it is dispatched
            await manager.get_variable(session, node.outputs["o"], timeout_s=120)
            latencies.append(time.perf_counter() - start)

        await asyncio.gather(*(one(p, i * gap_s) for i, p in enumerate(prompts)))
    finally:
        await manager.stop()
        await client.aclose()
    return 1000 * statistics.mean(latencies) / out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--rate", type=float, default=8.0, help="requests per second (0: all at once)")
    parser.add_argument("--system-tokens", type=int, default=930)
    parser.add_argument("--question-tokens", type=int, default=20)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--fresh-system", action="store_true", help="a new system prompt every round and mode")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--startup-s", type=float, default=1200.0)
    parser.add_argument("--modes", nargs="+", help="only these modes (names as printed)")
    parser.add_argument("--burn-ms", type=float, default=2.0, help="CPU bursts: each burst's CPU time")
    parser.add_argument("--every-ms", type=float, default=40.0, help="CPU bursts: the time between bursts")
    args = parser.parse_args()
    burner = Burner(args.burn_ms, args.every_ms)
    gap_s = 1.0 / args.rate if args.rate > 0 else 0.0
    out = args.output_tokens
    with vllm_server(startup_timeout_s=args.startup_s) as server:
        vocab = vocab_size_of(server.model_folder)
        shared = random_prompts(1, args.system_tokens, vocab, "paths/system")[0]

        def prompts(tag: str) -> list[list[int]]:  # a fresh question each: only the system prompt is cached
            system = random_prompts(1, args.system_tokens, vocab, f"{tag}/system")[0] if args.fresh_system else shared
            return [system + q for q in random_prompts(args.requests, args.question_tokens, vocab, tag)]

        modes: dict[str, Callable[[list[list[int]]], Coroutine[Any, Any, float]]] = {
            "whole": lambda p: direct(server, p, gap_s, out, {}),
            "whole+priority": lambda p: direct(server, p, gap_s, out, {"priority": -1}),
            "streamed": lambda p: direct(server, p, gap_s, out, STREAMED),
            "streamed+priority": lambda p: direct(server, p, gap_s, out, {**STREAMED, "priority": -1}),
            "streamed, chunks of 16": lambda p: direct(server, p, gap_s, out, {**STREAMED, "stream_interval": 16}),
            "ids, chunks of 16": lambda p: direct(server, p, gap_s, out, {**IDS, "stream_interval": 16}),
            "ids": lambda p: direct(server, p, gap_s, out, IDS),
            "ids, chunks of 16, 5 ms CPU": lambda p: direct(server, p, gap_s, out, {**IDS, "stream_interval": 16}, 5.0),
            "whole, beside CPU bursts": lambda p: beside_bursts(burner, direct(server, p, gap_s, out, {})),
            "parrot": lambda p: via_parrot(server, p, gap_s, out),
            "parrot, chunks of 8": lambda p: via_parrot(server, p, gap_s, out, 8),
            "parrot, one chunk": lambda p: via_parrot(server, p, gap_s, out, out),
            "parrot, logprobs read": lambda p: via_parrot(server, p, gap_s, out, logprobs=True),
            "parrot, heartbeat 10 s": lambda p: via_parrot(server, p, gap_s, out, config=RARE_HEARTBEATS),
        }
        if args.modes:
            unknown = set(args.modes) - set(modes)
            if unknown:
                parser.error(f"unknown modes {sorted(unknown)}; known: {list(modes)}")
            modes = {m: modes[m] for m in args.modes}
        asyncio.run(direct(server, prompts("paths/warm"), gap_s, out, {}))
        results: dict[str, list[float]] = {m: [] for m in modes}
        for r in range(args.rounds):
            order = list(modes) if r % 2 == 0 else list(modes)[::-1]
            for i, mode in enumerate(order):
                results[mode].append(asyncio.run(modes[mode](prompts(f"paths/{r}/{i}"))))
        for mode, values in results.items():
            runs = ", ".join(f"{v:.1f}" for v in values)
            print(f"{mode:>20}: median {statistics.median(values):.1f} ms per output token ({runs})")


if __name__ == "__main__":
    main()
