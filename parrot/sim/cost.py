"""The step cost model: how long one engine step takes, from what the step computes.

A step is a batch of prefill chunks (tokens whose KV is computed, after `num_cached` tokens of
context already there) and decode rows (one token each, attending to its whole context), the
decode rows grouped by the prefix they share. Its time is

    step_s = step_overhead + row_overhead x sampled rows + combine(compute_s, memory_s)

- compute: 2 x body params FLOPs per token, 2 x LM-head params per sampled row (a prefill chunk
  samples only when it ends a prompt whose generation follows), and attention: 4 x layers x heads x
  head_dim FLOPs per (query, key) pair (causal within a chunk), at `peak_tflops x mfu`;
- memory: the weights once per step (decode is bandwidth-bound: a batch shares one read), plus
  the KV the attention reads and the KV the step writes, at `mem_bw x bw_efficiency`. With
  shared-prefix attention a group's shared prefix is read once for all its rows (the cascade
  kernel); without it (paged attention per context) every row reads its whole context;
- combine: `max` (a GPU overlaps the two: roofline) or `sum` (a small CPU does not).

Pure: no state, no clock; `parrot/sim/engine.py` builds a `StepShape` per step and sleeps this long.
"""

from __future__ import annotations

from dataclasses import dataclass

from parrot.sim.profiles import HardwareProfile, ModelProfile


@dataclass(frozen=True)
class PrefillChunk:
    num_tokens: int
    num_cached: int  # context tokens before the chunk (attended to, read once)
    samples: bool = False  # the chunk ends a prompt and samples its first output token


@dataclass(frozen=True)
class DecodeGroup:
    """Decode rows that share their first `shared_len` tokens of KV (0: no sharing)."""

    context_lens: tuple[int, ...]  # each row's context length, the token it decodes included
    shared_len: int = 0


@dataclass(frozen=True)
class StepShape:
    prefills: tuple[PrefillChunk, ...] = ()
    decodes: tuple[DecodeGroup, ...] = ()

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.prefills) + self.num_decode_rows

    @property
    def num_decode_rows(self) -> int:
        return sum(len(g.context_lens) for g in self.decodes)

    @property
    def num_sampled(self) -> int:
        return self.num_decode_rows + sum(c.samples for c in self.prefills)


@dataclass(frozen=True)
class StepCost:
    flops: float
    bytes: float
    compute_s: float
    memory_s: float
    seconds: float


class StepCostModel:
    def __init__(self, hardware: HardwareProfile, model: ModelProfile, shared_prefix_attention: bool = True) -> None:
        self.hardware = hardware
        self.model = model
        self.shared_prefix_attention = shared_prefix_attention

    def flops(self, shape: StepShape) -> float:
        m = self.model
        pairs = sum(c.num_tokens * c.num_cached + c.num_tokens * (c.num_tokens + 1) / 2 for c in shape.prefills)
        pairs += sum(sum(g.context_lens) for g in shape.decodes)
        return (
            2.0 * m.body_params * shape.num_tokens
            + 2.0 * m.head_params * shape.num_sampled
            + (m.attention_flops_per_pair * pairs)
        )

    def kv_tokens_read(self, shape: StepShape) -> int:
        num = sum(c.num_cached for c in shape.prefills)
        for g in shape.decodes:
            num += sum(g.context_lens)
            if self.shared_prefix_attention and g.shared_len:
                num -= g.shared_len * (len(g.context_lens) - 1)  # the shared prefix read once
        return num

    def bytes(self, shape: StepShape) -> float:
        if not shape.num_tokens:
            return 0.0
        kv = self.model.kv_bytes_per_token * (self.kv_tokens_read(shape) + shape.num_tokens)
        return float(self.model.weight_bytes + kv)

    def cost(self, shape: StepShape) -> StepCost:
        hw = self.hardware
        flops, nbytes = self.flops(shape), self.bytes(shape)
        compute_s = flops / (hw.peak_tflops * 1e12 * hw.mfu)
        memory_s = nbytes / (hw.mem_bw_gbps * 1e9 * hw.bw_efficiency)
        work_s = max(compute_s, memory_s) if hw.combine == "max" else compute_s + memory_s
        seconds = (hw.step_overhead_ms + hw.row_overhead_ms * shape.num_sampled) / 1e3 + work_s
        return StepCost(flops, nbytes, compute_s, memory_s, seconds if shape.num_tokens else 0.0)

    def step_s(self, shape: StepShape) -> float:
        return self.cost(shape).seconds
