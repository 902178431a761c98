"""Peer engines that Parrot's engine is measured against, side by side, on the same model folder.

Every peer offers the same two measurements (the `Peer` protocol), so a harness can run them in
turn and report ratios:

- `measure_prefill(lengths)`: prompt tokens per second for one prompt of each length, measured as
  the time to a single generated token.
- `measure_decode(batch_sizes, new_tokens)`: generated tokens per second with that many sequences
  decoding at once, over the decode phase only (after every sequence has its first token).

Prompts are random token ids (`random_prompts`), distinct per measurement, so no prefix cache
can serve one measurement from another.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from typing import Protocol

# Ids below this are special or control tokens in LLaMA-family vocabularies; random prompts avoid them.
FIRST_PLAIN_TOKEN_ID = 256


class Peer(Protocol):
    name: str

    def measure_prefill(self, lengths: list[int]) -> dict[int, float]:
        """Prompt length -> prefill tokens/s."""
        ...

    def measure_decode(self, batch_sizes: list[int], new_tokens: int) -> dict[int, float]:
        """Number of concurrent sequences -> decode tokens/s over all of them."""
        ...


def random_prompts(num_prompts: int, prompt_len: int, vocab_size: int, seed: str) -> list[list[int]]:
    """`num_prompts` prompts of `prompt_len` random plain token ids; distinct seeds give distinct prompts."""
    rng = random.Random(seed)
    return [[rng.randrange(FIRST_PLAIN_TOKEN_ID, vocab_size) for _ in range(prompt_len)] for _ in range(num_prompts)]


# Seeds are strings naming the measurement, so no two measurements can draw the same stream (one
# prompt a prefix of another would be a prefix-cache hit).


def prefill_rates(lengths: list[int], repeats: int, seconds: Callable[[int, int], float]) -> dict[int, float]:
    """Prompt length -> prefill tokens/s, every peer's statistic: `seconds(prompt_len, r)` times the
    r-th distinct prompt of that length to its single output token; prompt 0 warms the shape up,
    the rate is prompt_len over the median of prompts 1..`repeats`."""
    rates: dict[int, float] = {}
    for prompt_len in lengths:
        seconds(prompt_len, 0)
        rates[prompt_len] = prompt_len / statistics.median(seconds(prompt_len, r) for r in range(1, repeats + 1))
    return rates


def prefill_seed(prompt_len: int, repeat: int) -> str:
    """A seed per (length, repeat), so every prefill prompt (warm-up included) is a different one."""
    return f"prefill/{prompt_len}/{repeat}"


def decode_seed(batch_size: int, warm_up: bool = False) -> str:
    """A seed per batch size (and its warm-up): each decode run starts from prompts never seen before."""
    return f"decode/{batch_size}/{'warm-up' if warm_up else 'measured'}"


# A warm-up run of each new batch shape first: oneDNN and torch.compile specialise per shape, and
# the first run of a shape pays for it.
WARM_UP_TOKENS = 4
