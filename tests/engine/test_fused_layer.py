"""The fused decoder layer (kernels/fused.py): one native call per layer gives the per-op native
path's bits (hidden states and KV cache) on the steps it takes, in both modes it takes (the
batch-invariant VNNI linears with rowwise attention at any row count; the dot kernel with
per-context decode at up to 4 decode rows), and leaves the steps it does not take to that path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from parrot.engine import kernels
from parrot.engine.attention.base import PagedAttention, SeqSpec
from parrot.engine.attention.rowwise import RowwiseAttention
from parrot.engine.config import EngineConfig
from parrot.engine.kernels import library
from parrot.engine.kv.cache import KVCache
from parrot.engine.llm_engine import LLMEngine
from parrot.engine.model.layers import Linear
from parrot.engine.model.llama import LlamaModel
from parrot.engine.model.loader import load_model
from tests.engine.fused_support import Counted, count_calls, tokens_fused_or_not, write_tiny32

pytestmark = pytest.mark.skipif(not kernels.available(), reason="no AVX512-BF16 CPU or no C compiler")
BLOCK = 16


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory, default_model_folder: Path) -> Path:
    return write_tiny32(tmp_path_factory, default_model_folder)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Counted:
    return count_calls(monkeypatch, library.load(), "parrot_decoder_layer")


def native_model(folder: Path, invariant: bool, qkv_bias: bool = False) -> LlamaModel:
    model = load_model(folder, torch.bfloat16)
    if qkv_bias:  # Qwen2-style: a bias on the QKV projection
        gen = torch.Generator().manual_seed(1)
        for layer in model.layers:
            old = layer.qkv
            new = Linear(old.in_features, old.out_features, bias=True, dtype=torch.bfloat16)
            new.weight = old.weight
            new.bias = nn.Parameter(torch.randn(old.out_features, generator=gen).to(torch.bfloat16), False)
            layer.qkv = new
    assert kernels.apply_native(model).applied
    if invariant:
        kernels.apply_batch_invariant(model)
    return model


def run_steps(model: LlamaModel, backend_cls: type, steps: list[list[tuple[int, int]]]) -> tuple[list, KVCache]:
    """Runs steps of (num_new, seq_len) per sequence (sequence i owns blocks 4i..4i+3); returns
    each step's hidden states and the cache."""
    cfg = model.cfg
    cache = KVCache(cfg.num_layers, 32, BLOCK, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16)
    backend = backend_cls(cache, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, True)
    gen = torch.Generator().manual_seed(0)
    hidden = []
    for step in steps:
        specs = [SeqSpec(new, end, list(range(4 * i, 4 * i + 4))) for i, (new, end) in enumerate(step)]
        positions = torch.cat([torch.arange(end - new, end) for new, end in step])
        seq_of_row = torch.cat([torch.full((new,), i) for i, (new, _) in enumerate(step)])
        slots = (4 * seq_of_row + positions // BLOCK) * BLOCK + positions % BLOCK
        ids = torch.randint(3, cfg.vocab_size, (positions.numel(),), generator=gen)
        backend.prepare(specs, slots)
        with torch.inference_mode():
            hidden.append(model(ids, positions, backend.forward))
    return hidden, cache


# Prompts of 37, 20 and 5 tokens (the first in two chunks), then decode steps of 3, 2 and 1 rows.
STEPS = [[(20, 20), (20, 20), (5, 5)], [(17, 37)], [(1, 38), (1, 21), (1, 6)], [(1, 39), (1, 22)], [(1, 40)]]


@pytest.mark.parametrize("qkv_bias", [False, True], ids=["llama", "qkv-bias"])
def test_rowwise_steps_are_fused_bit_for_bit(folder: Path, counted: Counted, qkv_bias: bool) -> None:
    model = native_model(folder, invariant=True, qkv_bias=qkv_bias)
    assert kernels.set_fused(model, False) == 3
    per_op, per_op_cache = run_steps(model, RowwiseAttention, STEPS)
    assert counted.calls == 0
    assert kernels.set_fused(model, True) == 3
    fused, fused_cache = run_steps(model, RowwiseAttention, STEPS)
    assert counted.calls == 3 * len(STEPS)  # every step, prefill chunks included: one call per layer
    assert model.layers[0].step is model.layers[2].step  # one step descriptor for the model's layers
    step = model.layers[0].step
    assert step.desc is None and step.held == []  # released by the last layer of each pass
    for ours, theirs in zip(fused, per_op, strict=True):
        assert torch.equal(ours, theirs)
    assert torch.equal(fused_cache.k, per_op_cache.k)
    assert torch.equal(fused_cache.v, per_op_cache.v)


def test_paged_decode_steps_of_up_to_four_rows_are_fused_bit_for_bit(folder: Path, counted: Counted) -> None:
    model = native_model(folder, invariant=False)
    prompts = [(9, 9), (30, 30), (3, 3), (17, 17), (2, 2)]
    five = [(1, 12), (1, 33), (1, 5), (1, 19), (1, 3)]
    steps = [prompts, [(1, 10), (1, 31), (1, 4), (1, 18)], [(1, 11), (1, 32)], five]
    kernels.set_fused(model, False)
    per_op, per_op_cache = run_steps(model, PagedAttention, steps)
    kernels.set_fused(model, True)
    fused, fused_cache = run_steps(model, PagedAttention, steps)
    assert counted.calls == 3 * 2  # the 4- and 2-row decode steps; not the prefill, not 5 rows (oneDNN)
    for ours, theirs in zip(fused, per_op, strict=True):
        assert torch.equal(ours, theirs)
    assert torch.equal(fused_cache.k, per_op_cache.k)
    assert torch.equal(fused_cache.v, per_op_cache.v)


def test_torch_pieces_and_autograd_take_the_per_op_path(folder: Path, counted: Counted) -> None:
    model = load_model(folder, torch.bfloat16)  # no transform: the layers are torch DecoderLayers
    run_steps(model, RowwiseAttention, STEPS[:1])
    native = native_model(folder, invariant=True)
    cfg = native.cfg
    cache = KVCache(cfg.num_layers, 32, BLOCK, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16)
    backend = RowwiseAttention(cache, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, True)
    backend.prepare([SeqSpec(4, 4, [0])], torch.arange(4))
    with torch.no_grad():
        native(torch.arange(3, 7), torch.arange(4), backend.forward)
    assert counted.calls == 3  # no_grad: fused; grad on would be the per-op path (the linears' torch)
    native.requires_grad_(False)
    with torch.enable_grad():
        native(torch.arange(3, 7), torch.arange(4), backend.forward)
    assert counted.calls == 3


def test_an_engine_gives_the_same_tokens_and_logprobs_fused_or_not(folder: Path, counted: Counted) -> None:
    engine = LLMEngine(EngineConfig(model=str(folder), dtype="bfloat16"))  # batch-invariant by default here
    assert engine.batch_invariant
    results = tokens_fused_or_not(engine, counted)
    assert results[True] == results[False]
