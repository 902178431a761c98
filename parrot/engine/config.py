"""Engine configuration: names and numbers only, validated once."""

from __future__ import annotations

from dataclasses import dataclass

from parrot.engine.cpu_features import cpu_computes_bf16

DTYPES = ("auto", "bfloat16", "float32")


def resolve_dtype(dtype: str) -> str:
    """`auto`: bfloat16 where the CPU computes it natively (AVX512-BF16 or AMX), float32 elsewhere.
    On a CPU without them (e.g. AVX2 only) torch's bfloat16 matmul runs ~60x slower than float32
    (a 512x576x1536 product: 0.7 vs 42 GFLOP/s on an AVX2 AMD EPYC); bf16 weights buy nothing there."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if cpu_computes_bf16() else "float32"


@dataclass(frozen=True)
class EngineConfig:
    model: str = "smollm2-135m"  # a known name, a Hugging Face folder, or a .gguf file
    # "auto" (resolve_dtype: bfloat16 on a CPU that computes it, float32 elsewhere; the config holds
    # the resolved name), "bfloat16", or "float32" (bit-exact tests)
    dtype: str = "auto"
    block_size: int = 16
    num_blocks: int | None = None  # if None, derived from kv_cache_bytes
    kv_cache_bytes: int = 1 << 30
    max_num_batched_tokens: int = 2048  # token budget of one step (decode tokens + prefill chunks)
    max_num_seqs: int = 128  # sequences per step
    # While latency-critical work decodes, cap the step's tokens so time per output token stays low.
    latency_max_batched_tokens: int | None = None
    # While latency-critical work only prefills (none of it decodes yet), a step takes up to this
    # many tokens (at least the cap): finer chunks would only delay that work's own first token
    # (a CPU prefills ~1.5x faster in 512-token steps than in 128-token ones), and this bounds how
    # long a request arriving mid-step waits. None: the cap applies to prefill-only steps too.
    latency_prefill_tokens: int | None = 512
    # While a job decodes, jobs of a lower tier (policy.py: latency-critical or aged, then priority)
    # compute at most this many prompt tokens a step: someone's output is not slowed by the prompts
    # of work that matters less (another tenant's flood, calls nobody awaits yet). A CPU reads the
    # weights once a step; a few prompt tokens ride along at little cost. None: no limit.
    outranked_chunk_tokens: int | None = 4
    policy: str = "priority"  # registered ordering policy (see sched/policy.py)
    aging_s: float = 5.0  # waiting longer than this lifts a job to the front tier
    attention: str = "shared_prefix"  # registered backend (attention/registry.py); "paged" = per-context
    cpu_kernels: bool = True  # native CPU kernels for bf16 models: applied once at load (kernels.apply_native)
    # Every kernel reduces in an order fixed per row, so a sequence's logits do not depend on its
    # batch, its prefill chunking or a forked prefix. None: on where the native kernels run the
    # model and its attention (bf16 on AVX512-BF16; there it costs nothing), off elsewhere (its torch
    # fallbacks run one row at a time: slow; float32 is nearly invariant without it: a scoring fork
    # batched with another request's forks came out 1e-7 relative apart).
    batch_invariant: bool | None = None
    num_threads: int | None = None  # torch intra-op threads; None keeps torch's default
    name: str | None = None  # model name reported to clients; default: derived from `model`

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        object.__setattr__(self, "dtype", resolve_dtype(self.dtype))
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError("num_blocks must be >= 1")
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be >= 1")
        if self.latency_max_batched_tokens is not None and self.latency_max_batched_tokens < 1:
            raise ValueError("latency_max_batched_tokens must be >= 1")
        if self.latency_prefill_tokens is not None and self.latency_prefill_tokens < 1:
            raise ValueError("latency_prefill_tokens must be >= 1")
        if self.outranked_chunk_tokens is not None and self.outranked_chunk_tokens < 1:
            raise ValueError("outranked_chunk_tokens must be >= 1")
