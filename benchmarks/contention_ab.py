"""What CPU taken beside a real vLLM costs its requests on a machine with few cores: GPTs-like
requests (a shared 930-token system prompt, a 20-token question, 32 output tokens, `--requests` at
`--rate` per second, whole answers) sent to one vLLM server, alternately with this process quiet
and with a thread of it burning `--burn-ms` of CPU every `--every-ms` (the shape of a manager's
work: short bursts as requests and streamed chunks arrive).

    python -m benchmarks.contention_ab --rounds 8                 # vLLM set up by scripts/setup_vllm.sh

vLLM's engine runs a step on every core (two threads here, meeting at a barrier each layer): a burst
that takes one core delays the whole step, so a share of CPU taken beside it costs more than that
share of its throughput. Prints the medians per mode and the median over rounds of the ratio
burning / quiet of the mean latency per output token, with this process's CPU per round.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time

from benchmarks.peers import random_prompts
from benchmarks.peers.vllm_server import vllm_server, vocab_size_of
from benchmarks.vllm_paths_ab import direct


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--rate", type=float, default=8.0, help="requests per second")
    parser.add_argument("--burn-ms", type=float, default=2.0)
    parser.add_argument("--every-ms", type=float, default=40.0)
    parser.add_argument("--startup-s", type=float, default=1200.0)
    args = parser.parse_args()
    gap_s = 1.0 / args.rate
    burner = Burner(args.burn_ms, args.every_ms)
    with vllm_server(startup_timeout_s=args.startup_s) as server:
        vocab = vocab_size_of(server.model_folder)
        system = random_prompts(1, 930, vocab, "contention/system")[0]

        def prompts(tag: str) -> list[list[int]]:  # a fresh question each: only the system prompt is cached
            return [system + q for q in random_prompts(args.requests, 20, vocab, tag)]

        asyncio.run(direct(server, prompts("contention/warm"), gap_s, {}))
        ms: dict[str, list[float]] = {"quiet": [], "burning": []}
        cpu: dict[str, list[float]] = {"quiet": [], "burning": []}
        for r in range(args.rounds):
            for i, mode in enumerate(["quiet", "burning"] if r % 2 == 0 else ["burning", "quiet"]):
                (burner.on.set if mode == "burning" else burner.on.clear)()
                started = time.process_time()
                ms[mode].append(asyncio.run(direct(server, prompts(f"contention/{r}/{i}"), gap_s, {})))
                cpu[mode].append(time.process_time() - started)
            burner.on.clear()
        for mode, values in ms.items():
            print(
                f"{mode:>8}: median {statistics.median(values):.1f} ms per output token, "
                f"{statistics.median(cpu[mode]):.2f} s of this process's CPU per round"
            )
        ratios = [b / q for b, q in zip(ms["burning"], ms["quiet"], strict=True)]
        print(f"burning / quiet, median of the rounds' ratios: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
