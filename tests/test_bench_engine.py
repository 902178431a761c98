"""The engine benchmark's bandwidth arithmetic: a decode step reads every weight once in the form
the engine keeps it (the block kernels' encodings where they run), plus each sequence's KV; and
the cases the kernel A/B reads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.engine.kernels import parse_case
from benchmarks.engine.throughput import decode_step_bytes, median_run, read_weight_bytes
from benchmarks.peers import prefill_rates
from benchmarks.peers.parrot_engine import ParrotEngineProbe
from parrot.engine.kernels import blocks, library
from parrot.engine.model.loader import load_model
from tests.engine.block_weights import block_model


def test_a_step_reads_the_weights_in_the_dtype_and_the_kv(tiny_model_folder: Path) -> None:
    cfg = load_model(tiny_model_folder, torch.float32).cfg
    h, kv, q = cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, cfg.num_heads * cfg.head_dim
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * cfg.intermediate_size
    weights = cfg.num_layers * per_layer + cfg.vocab_size * h
    kv_bytes = 2 * cfg.num_layers * kv * 10 * 3
    assert decode_step_bytes(cfg, 4, batch=3, context_len=10) == (weights + kv_bytes) * 4
    assert decode_step_bytes(cfg, 4, batch=3, context_len=10, weight_bytes=1000) == 1000 + kv_bytes * 4


@pytest.mark.skipif(library.blocks_library() is None, reason=library.blocks_status())
def test_block_pieces_are_counted_at_their_encodings_size(tiny_model_folder: Path) -> None:
    model = block_model(tiny_model_folder)
    assert read_weight_bytes(model) is None  # torch pieces: the dtype's size
    blocks.apply_blocks(model)
    pieces = [m for m in model.modules() if isinstance(m, (blocks.BlockLinear, blocks.BlockLMHead))]
    expected = 0
    for m in pieces:
        encoded = m.encoded.packed
        assert encoded is not None
        expected += encoded.nbytes
    assert read_weight_bytes(model) == expected


def test_a_peers_figures_are_the_medians_of_its_rounds() -> None:
    runs = [
        {"prefill_tok_s": {128: 300.0, 512: 410.0}, "decode_tok_s": {1: 30.0}},
        {"prefill_tok_s": {128: 390.0, 512: 400.0}, "decode_tok_s": {1: 20.0}},
        {"prefill_tok_s": {128: 350.0, 512: 500.0}, "decode_tok_s": {1: 25.0}},
    ]
    assert median_run(runs) == {"prefill_tok_s": {128: 350.0, 512: 410.0}, "decode_tok_s": {1: 25.0}}


def test_the_parrot_probe_prefills_in_one_request_and_frees_its_contexts(tiny_model_folder: Path) -> None:
    probe = ParrotEngineProbe(str(tiny_model_folder), dtype="float32", repeats=3)
    try:
        rates = probe.measure_prefill([8, 16])
        assert sorted(rates) == [8, 16]
        assert min(rates.values()) > 0
        stats = probe.engine.stats()
        assert stats.num_contexts == 0
        assert stats.num_steps == 8  # one step per prompt (4 per length): the fill and its token together
    finally:
        probe.close()


def test_prefill_rates_drop_the_warm_up_and_take_the_median_of_the_rest() -> None:
    times = {(8, 0): 9.0, (8, 1): 0.5, (8, 2): 0.25, (8, 3): 2.0, (4, 0): 9.0, (4, 1): 1.0, (4, 2): 2.0, (4, 3): 4.0}
    calls: list[tuple[int, int]] = []

    def seconds(prompt_len: int, r: int) -> float:
        calls.append((prompt_len, r))
        return times[(prompt_len, r)]

    assert prefill_rates([8, 4], 3, seconds) == {8: 16.0, 4: 2.0}
    assert calls == [(8, 0), (8, 1), (8, 2), (8, 3), (4, 0), (4, 1), (4, 2), (4, 3)]


def test_the_kernel_ab_reads_decode_prompt_and_prompt_batch_cases() -> None:
    assert [parse_case(c) for c in ("d32", "p512", "p8x128")] == [("d", 1, 32), ("p", 1, 512), ("p", 8, 128)]
    assert [parse_case(c) for c in ("d2x8", "x12", "p", "p12y", "p1x2x3", "")] == [None] * 6
