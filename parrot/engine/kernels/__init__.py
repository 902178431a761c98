"""Native CPU kernels for the bf16 decoder, applied to a loaded model as a transform.

The model (parrot.engine.model) is plain torch and the reference. `apply_native(model)` swaps its
pieces for native ones (transform.py); the engine applies it once after loading when
`EngineConfig.cpu_kernels` is set, and hands the same on/off to its attention backend (native
decode and prefill attention, decode.py) and its sampler (native greedy argmax + logsumexp). There is no
global switch: a model or backend built without the kernels runs torch ops, whatever else runs
in the process.

- library.py: builds cpu_kernels.c and block_kernels.c with gcc once per process (ctypes; the C
  code both share is csrc/: see README.md), their signatures, `status()`;
- ops.py: the native ops with their torch fallbacks (linear, RMSNorm, RoPE, SiLU*up, argmax);
- decode.py: attention over the paged KV cache, read in place: decode (per context and
  shared-prefix cascade) and the causal prefill of a chunk;
- pieces.py: the native model pieces (linear, norm, SiLU*up, rotary, LM head);
- fused.py: `FusedDecoderLayer`, a whole decoder layer in one native call where the step allows
  (fused_f32.py: a float32 model's decode steps on block_kernels.c; fused_step.py: the step
  descriptor both share);
- transform.py: `apply_native`, which swaps them in (`apply_elementwise`: a float32 model's
  RMSNorm, SiLU*up and rotary on the AVX2 kernels); `apply_engine_kernels`, what an engine
  applies at start, logged once on the "parrot.engine.kernels" logger;
- invariant.py: `apply_batch_invariant`, projections whose per-row result ignores the row count;
- blocks.py + block_kernels.c: a float32 GGUF model's linears over its exact 4/8-bit blocks (AVX2),
  `apply_blocks`.
This package may import parrot.engine.model (to transform it); the model never imports it.
"""

from __future__ import annotations

from parrot.engine.kernels.blocks import BlockLinear, BlockLMHead, BlocksReport, apply_blocks
from parrot.engine.kernels.decode import (
    CascadePieces,
    attention_amx,
    cascade_decode,
    paged_decode,
    paged_decode_on,
    paged_decode_supported,
    paged_prefill,
    paged_prefill_on,
    prefill_matches_decode,
)
from parrot.engine.kernels.fused import FusedDecoderLayer, NativeRows, set_fused
from parrot.engine.kernels.fused_f32 import Float32DecodeRows
from parrot.engine.kernels.invariant import apply_batch_invariant
from parrot.engine.kernels.library import SIGNATURES, amx_available, available, cpu_supports_bf16_dot, load, status
from parrot.engine.kernels.ops import (
    AMX_MAX_ROWS,
    DOT_MAX_ROWS,
    NativeRotaryStep,
    add_rms_norm,
    argmax_logsumexp,
    linear,
    pack_amx,
    pack_row_invariant,
    pack_vnni,
    rms_norm,
    rope,
    rowwise_linear,
    silu_mul,
)
from parrot.engine.kernels.transform import (
    EngineKernels,
    NativeReport,
    apply_elementwise,
    apply_engine_kernels,
    apply_native,
)

__all__ = [
    "AMX_MAX_ROWS",
    "DOT_MAX_ROWS",
    "SIGNATURES",
    "BlockLMHead",
    "BlockLinear",
    "BlocksReport",
    "CascadePieces",
    "EngineKernels",
    "Float32DecodeRows",
    "FusedDecoderLayer",
    "NativeReport",
    "NativeRotaryStep",
    "NativeRows",
    "add_rms_norm",
    "amx_available",
    "apply_batch_invariant",
    "apply_blocks",
    "apply_elementwise",
    "apply_engine_kernels",
    "apply_native",
    "argmax_logsumexp",
    "attention_amx",
    "available",
    "cascade_decode",
    "cpu_supports_bf16_dot",
    "linear",
    "load",
    "pack_amx",
    "pack_row_invariant",
    "pack_vnni",
    "paged_decode",
    "paged_decode_on",
    "paged_decode_supported",
    "paged_prefill",
    "paged_prefill_on",
    "prefill_matches_decode",
    "rms_norm",
    "rope",
    "rowwise_linear",
    "set_fused",
    "silu_mul",
    "status",
]
