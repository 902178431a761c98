"""Engine configuration: names and numbers only, each field documented as data, validated once."""

from __future__ import annotations

from dataclasses import dataclass

from parrot.engine.cpu_features import cpu_computes_bf16
from parrot.protocol.config_fields import SettingError, check_bounds, setting

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
    """One builtin engine's settings (`parrot serve`'s builtin engine, `parrot engine`): its model, KV
    cache and batch scheduler."""

    # Flat, unlike ManagerConfig: one engine is one concern, each name already says what it is about
    # (`kv_cache_bytes`, `max_num_seqs`, as on vLLM's command line), and tests build it with a few
    # keywords in many places.

    model: str = setting("smollm2-135m", "a known model name, a Hugging Face LLaMA-family folder, or a .gguf file")
    dtype: str = setting(
        "auto",
        "auto (bfloat16 on a CPU that computes it natively, float32 elsewhere; the config holds the resolved "
        "name), bfloat16, or float32 (bit-exact tests)",
    )
    block_size: int = setting(16, "tokens per KV cache block", ge=1)
    num_blocks: int | None = setting(None, "KV cache blocks (none: as many as kv_cache_bytes holds)", ge=1)
    kv_cache_bytes: int = setting(1 << 30, "KV cache size in bytes, when num_blocks is none")
    max_num_batched_tokens: int = setting(2048, "token budget of one step (decode tokens + prefill chunks)", ge=1)
    max_num_seqs: int = setting(128, "sequences per step", ge=1)
    # While latency-critical work decodes, cap the step's tokens so time per output token stays low.
    latency_max_batched_tokens: int | None = setting(
        None, "a step's tokens while latency-critical work decodes (none: no cap)", ge=1
    )
    # While latency-critical work only prefills (none of it decodes yet), finer chunks would only
    # delay that work's own first token (a CPU prefills ~1.5x faster in 512-token steps than in
    # 128-token ones), and this bounds how long a request arriving mid-step waits.
    latency_prefill_tokens: int | None = setting(
        512,
        "a step's tokens (at least the cap) while latency-critical work only prefills, and for 2 s after two "
        "tiers met (none: the cap applies to prefill-only steps too)",
        ge=1,
    )
    # While a job decodes, jobs of a lower tier (sched/policy.py: latency-critical or aged, then
    # priority) compute few prompt tokens a step: someone's output is not slowed by the prompts of
    # work that matters less (another tenant's flood, calls nobody awaits yet). A CPU reads the
    # weights once a step; a few prompt tokens ride along at little cost.
    outranked_chunk_tokens: int | None = setting(
        4, "prompt tokens a step lower tiers may compute while a better tier decodes (none: no limit)", ge=1
    )
    policy: str = setting("priority", "the batch scheduler's ordering policy (sched/policy.py)")
    aging_s: float = setting(5.0, "a job waiting longer than this is lifted to the front tier")
    attention: str = setting(
        "shared_prefix",
        "attention backend (attention/registry.py): shared_prefix (forks read a shared prefix once), paged "
        "(per context), ...",
    )
    cpu_kernels: bool = setting(True, "native CPU kernels for bf16 models, applied once at load (kernels.apply_native)")
    # Every kernel reduces in an order fixed per row. Where the native kernels run the model and its
    # attention (bf16 on AVX512-BF16) it costs nothing; elsewhere its torch fallbacks run one row at
    # a time (slow), and float32 is nearly invariant without it (a scoring fork batched with another
    # request's forks came out 1e-7 relative apart).
    batch_invariant: bool | None = setting(
        None,
        "a sequence's logits independent of its batch, chunking and forked prefix (none: on where the native "
        "kernels run the model and its attention)",
    )
    num_threads: int | None = setting(None, "torch intra-op threads (none or 0: torch's default)")
    name: str | None = setting(None, "model name reported to clients (none: derived from model)")

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise SettingError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}", field="dtype")
        object.__setattr__(self, "dtype", resolve_dtype(self.dtype))
        check_bounds(self)
