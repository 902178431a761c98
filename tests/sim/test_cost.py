"""The step cost model against step times computed by hand on round-number profiles."""

from __future__ import annotations

import dataclasses

import pytest

from parrot.sim import profiles
from parrot.sim.cost import DecodeGroup, PrefillChunk, StepCostModel, StepShape
from parrot.sim.profiles import HardwareProfile, ModelProfile

# A toy model: 2 layers, hidden 8, 2 heads (and KV heads) of dim 4, MLP 16, vocab 10, 1-byte dtype.
#   body  = 2 x (8 x (2 + 4) x 4 + 2 x 4 x 8 + 3 x 8 x 16) = 2 x (192 + 64 + 384) = 1280
#   head  = 10 x 8 = 80;  weights streamed = 1360 bytes;  KV bytes per token = 2 x 2 x 2 x 4 = 32
#   attention FLOPs per (query, key) pair = 4 x 2 x 2 x 4 = 64
MODEL = ModelProfile(
    "toy",
    "",
    layers=2,
    hidden=8,
    heads=2,
    kv_heads=2,
    head_dim=4,
    intermediate=16,
    vocab=10,
    tied_embeddings=True,
    dtype_bytes=1,
)
# 1 MFLOP/s and 1 MB/s effective, 10 ms per step, 1 ms per sampled row.
GPU = HardwareProfile(
    "toy-gpu",
    "",
    peak_tflops=1e-6,
    mem_gb=1.0,
    mem_bw_gbps=1e-3,
    mfu=1.0,
    bw_efficiency=1.0,
    step_overhead_ms=10.0,
    row_overhead_ms=1.0,
    combine="max",
    gpu_mem_util=1.0,
)
CPU = HardwareProfile(
    "toy-cpu",
    "",
    peak_tflops=1e-6,
    mem_gb=1.0,
    mem_bw_gbps=1e-3,
    mfu=1.0,
    bw_efficiency=1.0,
    step_overhead_ms=10.0,
    row_overhead_ms=1.0,
    combine="sum",
    gpu_mem_util=1.0,
)


def test_derived_model_sizes() -> None:
    assert [MODEL.body_params, MODEL.head_params, MODEL.weight_bytes] == [1280, 80, 1360]
    assert [MODEL.kv_bytes_per_token, MODEL.attention_flops_per_pair] == [32, 64]


def test_weights_streamed_as_blocks() -> None:
    # 4-bit blocks of the body (6 bits a weight with their scales), 8-bit of the head (9 bits):
    # 1280 x 6 / 8 + 80 x 9 / 8 = 960 + 90 bytes a step; KV stays in the dtype.
    blocks = dataclasses.replace(MODEL, body_bits=6.0, head_bits=9.0)
    assert blocks.weight_bytes == 1050
    assert blocks.kv_bytes_per_token == 32
    assert blocks.stored_bytes == 1360 + 1050
    real = profiles.model("smollm2-135m-blocks")  # the default model's 106 MiB of blocks
    assert real.weight_bytes == round(real.body_params * 0.75 + real.head_params * 1.125)
    assert 105 << 20 < real.weight_bytes < 107 << 20


def test_prefill_chunk_is_compute_bound_by_hand() -> None:
    # 4 tokens after 6 cached, sampling at the end: pairs = 4 x 6 + 4 x 5 / 2 = 34
    # FLOPs = 2 x 1280 x 4 + 2 x 80 x 1 + 64 x 34 = 10240 + 160 + 2176 = 12576 -> 12.576 ms
    # bytes = 1360 + 32 x (6 read + 4 written) = 1680 -> 1.68 ms;  max -> 12.576 ms
    # step = 10 + 1 x 1 + 12.576 = 23.576 ms
    cost = StepCostModel(GPU, MODEL).cost(StepShape(prefills=(PrefillChunk(4, 6, samples=True),)))
    assert [cost.flops, cost.bytes] == [12576.0, 1680.0]
    assert cost.seconds == pytest.approx(0.023576, abs=1e-12)


def test_decode_rows_with_and_without_shared_prefix_attention() -> None:
    # 3 rows of context 100, 110, 120 sharing 96 tokens; 1 row of 50 alone.
    # FLOPs = 2 x 1280 x 4 + 2 x 80 x 4 + 64 x (330 + 50) = 10240 + 640 + 24320 = 35200 -> 35.2 ms
    # paged:  KV read = 380 tokens; bytes = 1360 + 32 x (380 + 4) = 13648 -> 13.648 ms
    # shared: KV read = 380 - 96 x 2 = 188; bytes = 1360 + 32 x (188 + 4) = 7504 -> 7.504 ms
    shape = StepShape(decodes=(DecodeGroup((100, 110, 120), shared_len=96), DecodeGroup((50,))))
    shared, paged = StepCostModel(CPU, MODEL, True), StepCostModel(CPU, MODEL, False)
    assert [shared.kv_tokens_read(shape), paged.kv_tokens_read(shape)] == [188, 380]
    assert [shared.bytes(shape), paged.bytes(shape)] == [7504.0, 13648.0]
    # sum: 10 + 4 x 1 + 35.2 + 7.504 = 56.704 ms (shared), 10 + 4 + 35.2 + 13.648 = 62.848 ms (paged)
    assert shared.step_s(shape) == pytest.approx(0.056704, abs=1e-12)
    assert paged.step_s(shape) == pytest.approx(0.062848, abs=1e-12)
    # max (GPU): compute-bound here: 10 + 4 + 35.2 = 49.2 ms either way
    assert StepCostModel(GPU, MODEL, False).step_s(shape) == pytest.approx(0.0492, abs=1e-12)


def test_an_empty_step_costs_nothing() -> None:
    assert StepCostModel(GPU, MODEL).step_s(StepShape()) == 0.0


def test_paper_setup_decode_is_bandwidth_bound_by_hand() -> None:
    # LLaMA-13B: body = 40 x (5120 x 120 x 128 + 40 x 128 x 5120 + 3 x 5120 x 13824) = 12,687,769,600
    # head = 32000 x 5120 = 163,840,000; streamed = 2 x 12,851,609,600 = 25,703,219,200 bytes
    # one row of 1000 tokens on the A100: bytes = 25,703,219,200 + 819,200 x 1001 = 26,523,238,400
    # -> 26,523,238,400 / (2039e9 x 0.8) = 16.25995 ms; FLOPs = 2 x 12,851,609,600 + 20480 x 1000
    # = 25,723,699,200 -> / (312e12 x 0.55) = 0.1499 ms; step = 4 + 0.02 + 16.25995 = 20.27995 ms
    setup = profiles.setup("a100-13b")
    assert [setup.model.body_params, setup.model.weight_bytes] == [12_687_769_600, 25_703_219_200]
    cost = StepCostModel(setup.hardware, setup.model).cost(StepShape(decodes=(DecodeGroup((1000,)),)))
    assert cost.bytes == 26_523_238_400.0
    assert cost.seconds == pytest.approx(0.004 + 0.00002 + 26_523_238_400 / (2039e9 * 0.8), abs=1e-12)
    assert cost.seconds * 1e3 == pytest.approx(20.27995, abs=1e-5)


def test_setup_derives_kv_blocks_from_memory() -> None:
    # A100-80GB x 0.9 = 72e9 bytes; LLaMA-13B stores 2 x (12,687,769,600 + 2 x 163,840,000)
    # = 26,030,899,200 bytes; left 45,969,100,800 / (819,200 x 16) = 3507.0 -> 3507 blocks
    assert profiles.setup("a100-13b").num_blocks == 3507
    assert profiles.setup("cpu-smollm2", num_blocks=64).num_blocks == 64
