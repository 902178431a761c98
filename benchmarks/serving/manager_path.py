"""What Parrot's path costs a request on its way to an engine: GPTs-like requests (a shared
~900-word system prompt and a question, 32 output tokens, `--requests` at `--rate` per second) sent
to a fake vLLM (benchmarks/peers/fake_openai.py, in a process of its own, so its work is not
counted) that streams a token every `--step-ms`, either plainly (the `openai` client, whole
answers: the app benchmark's request-level client), the same client through the manager's OpenAI
route (as the app benchmark's Parrot configurations send plain requests: the mixed workload's
chats; and that again with the tokenizer's recent-text cache off), as a session per request over
HTTP with the SDK (create with the call, get, delete) through the manager and the OpenAI engine
adapter, or as the app benchmark's Parrot configuration sends them: one request each
(`SemanticFunction.arun`, `POST /v1/run`).

    python -m benchmarks.serving.manager_path --rounds 5

Modes alternate within each round. Prints, per mode, the median over rounds of the mean latency
per output token and of this process's CPU time per request (the client, and for Parrot also the
manager, which runs here on a server thread); writes results.json and manifest.json to `--out`
(default bench_results/manager-path-<machine kind>).
The fake's tokens cost no CPU: on a real engine sharing the machine, the CPU the path takes is
taken from the engine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import resource
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import httpx

from benchmarks.apps.baselines import OpenAIClient
from benchmarks.apps.deploy import API_KEY, UpstreamServer, UpstreamSpec
from benchmarks.apps.workloads.common import literal, semantic
from benchmarks.common.resultset import default_out, write_manifest
from parrot.engine.model.loader import DEFAULT_MODEL, resolve_model_folder
from parrot.frontend import AsyncSession
from parrot.launch import OpenAIUpstream
from parrot.serve import ManagerConfig
from parrot.text.recent import Encoded, RecentTexts

NUM_TOKENS = 32
WHOLE_PROMPTS = "the same, prompts tokenized whole"  # the mode run with the recent-text cache off
WORDS = "the quick brown fox jumps over a lazy dog while many clever people watch it"


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def no_recent_texts() -> Iterator[None]:
    """The tokenizer without its recent-text cache (parrot/text/recent.py): every text tokenized
    whole (the A/B of that cache; modes run one at a time)."""
    cached = RecentTexts.encode_offsets

    def whole(self: RecentTexts, text: str, encode: Callable[[str], Encoded]) -> Encoded:
        return encode(text)

    RecentTexts.encode_offsets = whole  # type: ignore[method-assign]
    try:
        yield
    finally:
        RecentTexts.encode_offsets = cached  # type: ignore[method-assign]


def start_fake(step_ms: float) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [sys.executable, "-m", "benchmarks.peers.fake_openai", "--port", str(port), "--step-ms", str(step_ms)]
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v1/models", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the fake upstream did not start")


async def timed(requests: int, gap_s: float, one: Callable[[int], Awaitable[None]]) -> tuple[float, float]:
    """(mean ms per output token, CPU ms per request) of `requests` sent `gap_s` apart."""
    latencies: list[float] = []

    async def run(i: int) -> None:
        await asyncio.sleep(i * gap_s)
        start = time.perf_counter()
        await one(i)
        latencies.append(time.perf_counter() - start)

    cpu = cpu_s()
    await asyncio.gather(*(run(i) for i in range(requests)))
    return 1000 * statistics.mean(latencies) / NUM_TOKENS, 1000 * (cpu_s() - cpu) / requests


async def measure(url: str, parrot_url: str, args: argparse.Namespace) -> dict[str, list[tuple[float, float]]]:
    words, rng = WORDS.split(), random.Random(1)
    system = " ".join(rng.choice(words) for _ in range(900))
    template = literal(system) + "\n\nUser: {{input:query}}\nAssistant:{{output:answer}}"
    fn = semantic("app", template, ["query"], "answer", NUM_TOKENS)
    client = OpenAIClient(url, "fake")
    via_manager = OpenAIClient(parrot_url, "fake", API_KEY)
    salt = iter(range(1 << 30))

    async def plain(i: int) -> None:
        await client.complete(f"{system}\n\nUser: question {i} ({next(salt)})\nAssistant:", NUM_TOKENS)

    async def parrot(i: int) -> None:
        async with AsyncSession(parrot_url, api_key=API_KEY) as session:
            await fn.invoke(session.core, f"question {i} ({next(salt)})").aget()

    async def parrot_run(i: int) -> None:
        await fn.arun(parrot_url, f"question {i} ({next(salt)})", api_key=API_KEY)

    async def openai_route(i: int) -> None:
        await via_manager.complete(f"{system}\n\nUser: question {i} ({next(salt)})\nAssistant:", NUM_TOKENS)

    modes = {
        "plain (openai client, whole answers)": plain,
        "openai client through the manager": openai_route,
        WHOLE_PROMPTS: openai_route,
        "Parrot (SDK session, manager, adapter)": parrot,
        "Parrot, one request (fn.arun)": parrot_run,
    }
    gap_s = 1.0 / args.rate
    for one in modes.values():  # warm-up: connections, caches, the manager's first heartbeat
        await timed(args.requests, gap_s, one)
    results: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for mode in list(modes) if r % 2 == 0 else list(modes)[::-1]:
            with no_recent_texts() if mode == WHOLE_PROMPTS else contextlib.nullcontext():
                results[mode].append(await timed(args.requests, gap_s, modes[mode]))
    await client.aclose()
    await via_manager.aclose()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--rate", type=float, default=8.0, help="requests per second")
    parser.add_argument("--step-ms", type=float, default=20.0, help="the fake upstream's time per token")
    parser.add_argument("--out", type=Path, help="default: bench_results/manager-path-<machine kind>")
    args = parser.parse_args()
    args.out = args.out or default_out("manager-path")
    proc, url = start_fake(args.step_ms)
    folder = str(resolve_model_folder(DEFAULT_MODEL))
    server = UpstreamServer(UpstreamSpec("parrot", OpenAIUpstream(url, "fake", folder), ManagerConfig()))
    try:
        server.start()
        results = asyncio.run(measure(url, server.url, args))
    finally:
        server.stop()
        proc.terminate()
        proc.wait(timeout=30)
    summary = {}
    for mode, runs in results.items():
        ms = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        summary[mode] = {"ms_per_token": ms, "cpu_ms_per_request": cpu, "runs": runs}
        print(f"{mode:>40}: {ms:.2f} ms per output token, {cpu:.1f} ms of CPU per request (median of {len(runs)})")
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {k: v for k, v in vars(args).items() if k != "out"}
    (args.out / "results.json").write_text(json.dumps({"args": meta, "modes": summary}, indent=2) + "\n")
    write_manifest(args.out, "manager-path")


if __name__ == "__main__":
    main()
