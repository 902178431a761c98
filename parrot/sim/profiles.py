"""Hardware, model and setup profiles: the data files in `profiles/` as frozen dataclasses.

`hardware.toml` holds devices (datasheet numbers and the cost model's efficiencies, or a fit),
`models.toml` model shapes (parameter counts and KV bytes are derived here, never typed in),
`setups.toml` a device, a model and the simulated engine's scheduling settings.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path
from typing import Any

PROFILES = Path(__file__).parent / "profiles"


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    about: str
    peak_tflops: float
    mem_gb: float
    mem_bw_gbps: float
    mfu: float
    bw_efficiency: float
    step_overhead_ms: float
    row_overhead_ms: float
    combine: str  # "max" (roofline) or "sum"
    gpu_mem_util: float

    def __post_init__(self) -> None:
        if self.combine not in ("max", "sum"):
            raise ValueError(f"hardware {self.name}: combine must be 'max' or 'sum', not {self.combine!r}")
        for f in ("peak_tflops", "mem_gb", "mem_bw_gbps", "mfu", "bw_efficiency"):
            if getattr(self, f) <= 0:
                raise ValueError(f"hardware {self.name}: {f} must be > 0")


@dataclass(frozen=True)
class ModelProfile:
    name: str
    about: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    dtype_bytes: int
    # Bits a step streams per weight where the engine reads them in another form than the dtype
    # (the builtin engine's block kernels: 4-bit blocks of the body, 8-bit ones of the LM head); 0:
    # the dtype's.
    body_bits: float = 0.0
    head_bits: float = 0.0

    @property
    def body_params(self) -> int:
        """Attention and MLP weights of every layer (the matmuls each token goes through)."""
        attn = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim + self.heads * self.head_dim * self.hidden
        return self.layers * (attn + 3 * self.hidden * self.intermediate)

    @property
    def head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def weight_bytes(self) -> int:
        """Bytes a step streams: body and LM head (the embedding is a lookup of a few rows)."""
        body = self.body_params * (self.body_bits / 8 if self.body_bits else self.dtype_bytes)
        head = self.head_params * (self.head_bits / 8 if self.head_bits else self.dtype_bytes)
        return round(body + head)

    @property
    def stored_bytes(self) -> int:
        """Bytes the weights occupy in the dtype (an untied embedding is a second vocab x hidden
        matrix), the streamed forms of `body_bits` / `head_bits` besides."""
        embed = 0 if self.tied_embeddings else self.vocab * self.hidden
        dense = (self.body_params + self.head_params + embed) * self.dtype_bytes
        return dense + (self.weight_bytes if self.body_bits or self.head_bits else 0)

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def attention_flops_per_pair(self) -> int:
        """FLOPs of one (query, key) pair over all layers and heads: QK^T and PV, 2 per MAC."""
        return 4 * self.layers * self.heads * self.head_dim


@dataclass(frozen=True)
class Setup:
    name: str
    about: str
    hardware: HardwareProfile
    model: ModelProfile
    block_size: int
    max_num_batched_tokens: int
    latency_max_batched_tokens: int
    max_model_len: int
    num_blocks: int  # resolved: never 0
    engines: int
    # The builtin engine's finer rules (parrot/engine/config.py, sched/plan.py), set where a setup
    # stands for it (the CPU setups); the defaults leave them out (the GPU setups).
    latency_prefill_tokens: int | None = None  # budget while latency work only prefills; None: the full budget
    outranked_chunk_tokens: int | None = None  # prompt tokens a step for lower-priority jobs; None: no limit
    remainder_share: int | None = None  # a prompt's last chunk may exceed a decode-free step by budget / this
    aging_s: float | None = None  # a job waiting this long joins the front tier; None: never
    max_num_seqs: int | None = None  # jobs a step; None: no limit


def _table(file: str, name: str) -> dict[str, Any]:
    tables = _load(file)
    if name not in tables:
        raise KeyError(f"no {name!r} in {file}; known: {sorted(tables)}")
    return dict(tables[name])


@cache
def _load(file: str) -> dict[str, Any]:
    with open(PROFILES / file, "rb") as f:
        return tomllib.load(f)


def _build(cls: type, name: str, table: dict[str, Any]) -> Any:
    names = {f.name for f in fields(cls)} - {"name"}
    unknown = set(table) - names
    if unknown:
        raise ValueError(f"{cls.__name__} {name}: unknown keys {sorted(unknown)}")
    return cls(name=name, **table)


def hardware(name: str) -> HardwareProfile:
    return _build(HardwareProfile, name, _table("hardware.toml", name))  # type: ignore[no-any-return]


def model(name: str) -> ModelProfile:
    return _build(ModelProfile, name, _table("models.toml", name))  # type: ignore[no-any-return]


def setup(name: str, **overrides: Any) -> Setup:
    """The named setup; `overrides` replace its engine settings (e.g. num_blocks=512)."""
    table = {**_table("setups.toml", name), **overrides}
    hw, mdl = hardware(table.pop("hardware")), model(table.pop("model"))
    if not table["num_blocks"]:
        free = hw.gpu_mem_util * hw.mem_gb * 1e9 - mdl.stored_bytes
        table["num_blocks"] = int(free // (mdl.kv_bytes_per_token * table["block_size"]))
        if table["num_blocks"] < 1:
            raise ValueError(f"setup {name}: the weights of {mdl.name} do not fit on {hw.name}")
    return _build(Setup, name, {**table, "hardware": hw, "model": mdl})  # type: ignore[no-any-return]
