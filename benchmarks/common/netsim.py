"""The network model of the application benchmarks: a client-to-service round trip per request.

The paper measured 100 round trips to a public LLM API (`network_rtt_ms.samples` in
paper_workloads.json). A request-level client pays one round trip per LLM call, drawn uniformly
from those samples, half before the call (the request travels) and half after (the answer travels
back). A Parrot application pays one per submission: its whole DAG travels at once and only the
final value comes back.

Draws are reproducible: an `RttSampler` owns a `random.Random` seeded by a string, so two
configurations that run the same workload with the same seed draw the same sequence (in the order
their calls start). A workload of independent clients (chats beside apps, concurrent chains) gives
each its own `stream`: a request-level app draws a round trip per call and a Parrot app one per
submission, so on one shared stream every later client would draw different round trips in each
configuration (the mixed workload's chat latency would then compare networks as well as servers).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class RttModel:
    """Measured round-trip times (ms); `scale` multiplies every draw (0 turns the network off)."""

    samples_ms: tuple[float, ...]
    scale: float = 1.0

    def __post_init__(self) -> None:
        if not self.samples_ms:
            raise ValueError("an RTT model needs at least one sample")
        if any(s < 0 for s in self.samples_ms) or self.scale < 0:
            raise ValueError("round-trip times and their scale must be >= 0")

    @classmethod
    def from_workloads(cls, workloads: dict, scale: float = 1.0) -> RttModel:
        """From a parsed paper_workloads.json."""
        return cls(tuple(float(s) for s in workloads["network_rtt_ms"]["samples"]), scale)

    @property
    def mean_ms(self) -> float:
        return self.scale * sum(self.samples_ms) / len(self.samples_ms)

    def sampler(self, seed: str) -> RttSampler:
        return RttSampler(self, seed)


class RttSampler:
    """One seeded stream of round trips; counts what it has charged."""

    def __init__(self, model: RttModel, seed: str, parent: RttSampler | None = None) -> None:
        self.model = model
        self.seed = seed
        self._rng = random.Random(seed)
        self.parent = parent  # the run's sampler, which counts this stream's draws too
        self._streams: dict[str, RttSampler] = {}
        self.num_round_trips = 0
        self.total_s = 0.0

    def stream(self, key: str) -> RttSampler:
        """The round trips of one independent client (`key`: its stable name in the workload, e.g.
        `chat/3`): the same draws in every configuration whatever the others draw; counted here too.
        The same key is the same stream (its draws go on, they do not start over)."""
        if key not in self._streams:
            self._streams[key] = RttSampler(self.model, f"{self.seed}/{key}", self)
        return self._streams[key]

    def draw_s(self) -> float:
        """The next round trip, in seconds."""
        rtt_s = self.model.scale * self._rng.choice(self.model.samples_ms) / 1000.0
        sampler: RttSampler | None = self
        while sampler is not None:
            sampler.num_round_trips += 1
            sampler.total_s += rtt_s
            sampler = sampler.parent
        return rtt_s

    async def around(self, call: Awaitable[T]) -> T:
        """Await `call` as one remote request: half a round trip before it, half after."""
        half_s = self.draw_s() / 2
        await _sleep(half_s)
        result = await call
        await _sleep(half_s)
        return result

    def draws(self, n: int) -> list[float]:
        """The next `n` round trips (seconds), e.g. for tests."""
        return [self.draw_s() for _ in range(n)]


class RoundTrip:
    """A round trip split in two halves: `await rt.out()` before a submission, `await rt.back()`
    after its result arrives (a Parrot submission whose result is read later)."""

    def __init__(self, sampler: RttSampler) -> None:
        self._half_s = sampler.draw_s() / 2

    async def out(self) -> None:
        await _sleep(self._half_s)

    async def back(self) -> None:
        await _sleep(self._half_s)


async def _sleep(seconds: float) -> None:
    if seconds > 0:
        await asyncio.sleep(seconds)


def summarize_ms(samples_ms: Sequence[float]) -> dict[str, float]:
    ordered = sorted(samples_ms)
    return {
        "mean": sum(ordered) / len(ordered),
        "p50": ordered[len(ordered) // 2],
        "min": ordered[0],
        "max": ordered[-1],
    }
