"""The float32 fused decoder layer (kernels/fused_f32.py): one native call per layer of a decode
step gives the per-op float32 path's bits (hidden states and KV cache), per context and over
shared-prefix cascade pieces, and leaves to that path the steps it does not take (prefill chunks,
steps above the block kernels' row limit, weights that are no block encoding, autograd)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from parrot.engine import kernels
from parrot.engine.attention.base import PagedAttention, SeqSpec
from parrot.engine.attention.shared_prefix import GroupingConfig
from parrot.engine.attention.shared_prefix_backend import SharedPrefixAttention
from parrot.engine.config import EngineConfig
from parrot.engine.kernels import blocks, library
from parrot.engine.kv.cache import KVCache
from parrot.engine.llm_engine import LLMEngine
from parrot.engine.model.llama import LlamaModel
from parrot.engine.model.loader import load_model, write_tiny_model
from tests.engine.block_weights import make_blocks, write_block_weights
from tests.engine.fused_support import Counted, count_calls, tokens_fused_or_not, write_tiny32

pytestmark = pytest.mark.skipif(library.blocks_library() is None, reason=library.blocks_status())
BLOCK = 16


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory, default_model_folder: Path) -> Path:
    return write_tiny32(tmp_path_factory, default_model_folder)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Counted:
    return count_calls(monkeypatch, library.blocks_library(), "parrot_decoder_layer_f32")


def f32_model(folder: Path, encoded: bool = True) -> LlamaModel:
    model = load_model(folder, torch.float32)
    if encoded:
        make_blocks(model)
    assert kernels.apply_blocks(model).applied == encoded
    assert kernels.apply_elementwise(model) > 0
    return model


def run_steps(
    model: LlamaModel, steps: list[list[tuple[int, int]]], shared: bool = False, prefix_blocks: int = 0
) -> tuple[list[torch.Tensor], KVCache, PagedAttention]:
    """Runs steps of (num_new, seq_len) per sequence on a native float32 backend; sequence i owns
    blocks 8i..8i+7 after the first `prefix_blocks` blocks, which every sequence shares (their KV
    written by sequence 0's prompt). Returns each step's hidden states, the cache and the backend."""
    cfg = model.cfg
    cache = KVCache(cfg.num_layers, 64, BLOCK, cfg.num_kv_heads, cfg.head_dim, torch.float32)
    args = (cache, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, True)
    grouping = GroupingConfig(min_group_size=2, min_shared_tokens=BLOCK)
    backend = SharedPrefixAttention(*args, grouping=grouping) if shared else PagedAttention(*args)
    assert backend.native
    gen = torch.Generator().manual_seed(0)

    def table(i: int) -> list[int]:
        return list(range(56, 56 + prefix_blocks)) + list(range(8 * i, 8 * i + 8))

    hidden = []
    for step in steps:
        specs = [SeqSpec(new, end, table(i)) for i, (new, end) in enumerate(step)]
        rows = [(i, p) for i, (new, end) in enumerate(step) for p in range(end - new, end)]
        positions = torch.tensor([p for _, p in rows])
        slots = torch.tensor([table(i)[p // BLOCK] * BLOCK + p % BLOCK for i, p in rows])
        ids = torch.randint(3, cfg.vocab_size, (len(rows),), generator=gen)
        backend.prepare(specs, slots)
        with torch.inference_mode():
            hidden.append(model(ids, positions, backend.forward))
    return hidden, cache, backend


def assert_same(
    a: tuple[list[torch.Tensor], KVCache, PagedAttention], b: tuple[list[torch.Tensor], KVCache, PagedAttention]
) -> None:
    for ours, theirs in zip(a[0], b[0], strict=True):
        assert torch.equal(ours, theirs)
    assert torch.equal(a[1].k, b[1].k)
    assert torch.equal(a[1].v, b[1].v)


# Prompts of 37, 20 and 5 tokens (the first in two chunks), then decode steps of 3, 2 and 1 rows.
STEPS = [[(20, 20), (20, 20), (5, 5)], [(17, 37)], [(1, 38), (1, 21), (1, 6)], [(1, 39), (1, 22)], [(1, 40)]]


def test_decode_steps_are_fused_bit_for_bit_per_context(folder: Path, counted: Counted) -> None:
    model = f32_model(folder)
    assert kernels.set_fused(model, False) == 3
    per_op = run_steps(model, STEPS)
    assert counted.calls == 0
    assert kernels.set_fused(model, True) == 3
    fused = run_steps(model, STEPS)
    assert counted.calls == 3 * 3  # the three decode steps, one call per layer; not the prefills
    assert model.layers[0].f32.step is model.layers[2].f32.step  # one step descriptor for the layers
    assert model.layers[0].f32.step.desc is None  # released by the last layer of each pass
    assert_same(fused, per_op)


def test_shared_prefix_decode_steps_are_fused_bit_for_bit(folder: Path, counted: Counted) -> None:
    model = f32_model(folder)
    # sequence 0 fills 40 tokens, the first 32 in the 2 shared blocks; then 3 sequences decode
    # past the shared prefix, read once for the 3 rows (the cascade's pieces)
    steps = [[(40, 40)], [(1, 41), (1, 33), (1, 33)], [(1, 42), (1, 34), (1, 34)]]
    kernels.set_fused(model, False)
    per_op = run_steps(model, steps, shared=True, prefix_blocks=2)
    assert per_op[2].num_shared_steps == 2
    kernels.set_fused(model, True)
    fused = run_steps(model, steps, shared=True, prefix_blocks=2)
    assert fused[2].num_shared_steps == 2
    assert counted.calls == 3 * 2
    assert_same(fused, per_op)


def test_steps_it_does_not_take_run_per_op(folder: Path, counted: Counted, monkeypatch: pytest.MonkeyPatch) -> None:
    run_steps(f32_model(folder, encoded=False), STEPS)  # random weights: no block encoding, torch linears
    assert counted.calls == 0
    model = f32_model(folder)
    monkeypatch.setattr(blocks, "MAX_ROWS", 2)  # the 3-row step is oneDNN's, per op
    kernels.set_fused(model, False)
    per_op = run_steps(model, STEPS)
    kernels.set_fused(model, True)
    fused = run_steps(model, STEPS)
    assert counted.calls == 3 * 2
    assert_same(fused, per_op)
    cfg = model.cfg
    cache = KVCache(cfg.num_layers, 4, BLOCK, cfg.num_kv_heads, cfg.head_dim, torch.float32)
    backend = PagedAttention(cache, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, True)
    backend.prepare([SeqSpec(1, 1, [0])], torch.arange(1))
    model.requires_grad_(False)
    with torch.enable_grad():
        model(torch.tensor([5]), torch.arange(1), backend.forward)
    assert counted.calls == 3 * 2  # autograd on: the per-op path


def test_an_engine_gives_the_same_tokens_and_logprobs_fused_or_not(
    tmp_path: Path, default_model_folder: Path, counted: Counted
) -> None:
    path = write_tiny_model(tmp_path / "tiny", default_model_folder, seed=5, num_heads=4, num_kv_heads=2, head_dim=32)
    engine = LLMEngine(EngineConfig(model=str(write_block_weights(path)), dtype="float32"))
    assert engine.stats().native_kernels.startswith("avx2_fma blocks")
    results = tokens_fused_or_not(engine, counted)
    assert results[True] == results[False]
