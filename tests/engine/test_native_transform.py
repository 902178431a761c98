"""The native transform of a loaded model (kernels.apply_native) and how the engine applies it:
pieces swapped in place with shared parameters, outputs close to the torch model's, nothing global
(a model or engine without the transform keeps torch's bits), and its status logged and reported."""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

import pytest
import torch

from parrot.engine import kernels, sync_client
from parrot.engine.attention.base import PagedAttention, SeqSpec
from parrot.engine.config import EngineConfig
from parrot.engine.kernels.transform import ELEMENTWISE_PIECES, NATIVE_PIECES
from parrot.engine.kv.cache import KVCache
from parrot.engine.llm_engine import LLMEngine
from parrot.engine.model.llama import LlamaModel
from parrot.engine.model.loader import load_model, write_tiny_model
from parrot.protocol import ExtendRequest, SamplingParams

needs_kernel = pytest.mark.skipif(not kernels.available(), reason="no AVX512-BF16 CPU or no C compiler")


@pytest.fixture(scope="module")
def native_shaped_folder(tmp_path_factory: pytest.TempPathFactory, default_model_folder: Path) -> Path:
    """A tiny model whose every piece the kernels take (head_dim 32: the native RoPE too)."""
    folder = tmp_path_factory.mktemp("models") / "tiny32"
    return write_tiny_model(folder, default_model_folder, seed=1, num_heads=4, num_kv_heads=2, head_dim=32)


def logits_of(model: LlamaModel, ids: list[int], native: bool) -> torch.Tensor:
    cfg = model.cfg
    cache = KVCache(cfg.num_layers, 4, 16, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16)
    backend = PagedAttention(cache, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, native)
    n = len(ids)
    backend.prepare([SeqSpec(n, n, [0, 1, 2, 3])], torch.arange(n))
    with torch.inference_mode():
        return model.logits(model(torch.tensor(ids), torch.arange(n), backend.forward), as_float=False)


def pieces(model: LlamaModel) -> dict[str, type]:
    return {name: type(m) for name, m in model.named_modules() if isinstance(m, tuple(NATIVE_PIECES))}


@needs_kernel
def test_every_piece_is_swapped_in_place_with_its_parameters(native_shaped_folder: Path) -> None:
    model = load_model(native_shaped_folder, torch.bfloat16)
    before = pieces(model)
    params = {name: p for name, p in model.named_parameters()}
    report = kernels.apply_native(model)
    assert report.applied and report.status == kernels.status()
    after = pieces(model)
    assert after.keys() == before.keys() and report.num_replaced == len(before)
    assert all(after[name] is NATIVE_PIECES[cls] for name, cls in before.items())
    assert {name: p for name, p in model.named_parameters()} == params  # the same tensors, not copies
    assert not any(m.training for m in model.modules())  # eval mode kept
    assert kernels.apply_native(model).num_replaced == 0  # idempotent


@needs_kernel
def test_transformed_model_is_close_and_the_torch_model_keeps_its_bits(native_shaped_folder: Path) -> None:
    ids = list(range(100, 137))
    plain, native = load_model(native_shaped_folder, torch.bfloat16), load_model(native_shaped_folder, torch.bfloat16)
    expected = logits_of(plain, ids, native=False)
    kernels.apply_native(native)
    for rows in (ids[:1], ids[:3], ids):  # the dot kernel, then AMX where present, then oneDNN
        ours, theirs = logits_of(native, rows, native=True), logits_of(plain, rows, native=False)
        torch.testing.assert_close(ours, theirs, atol=0.05, rtol=0.02)
        assert ours[-1].argmax() == theirs[-1].argmax()
    assert torch.equal(logits_of(plain, ids, native=False), expected)  # nothing global changed


def test_float32_models_are_left_alone(tiny_model_folder: Path) -> None:
    model = load_model(tiny_model_folder, torch.float32)
    before = pieces(model)
    report = kernels.apply_native(model)
    assert not report.applied and report.num_replaced == 0
    assert report.status == "unavailable: the kernels take bfloat16 weights and the model's are float32"
    assert pieces(model) == before


def greedy(engine: LLMEngine, ids: list[int]) -> list[int]:
    sync_client.extend_only(engine, ExtendRequest(context_id="c", token_ids=ids))
    sampling = SamplingParams(max_tokens=8, ignore_eos=True)
    tokens = sync_client.token_ids(
        sync_client.extend(engine, ExtendRequest(context_id="c", append=True, sampling=sampling))
    )
    return tokens


def test_engines_with_and_without_kernels_side_by_side(
    native_shaped_folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each engine's setting holds for its own model, backend and sampler, whatever the other does."""
    ids = list(range(200, 240))
    config = EngineConfig(model=str(native_shaped_folder), dtype="bfloat16", num_blocks=32)
    caplog.set_level(logging.INFO, logger="parrot.engine.kernels")
    torch_engine = LLMEngine(dataclasses.replace(config, cpu_kernels=False))
    native_engine = LLMEngine(config)
    off = "off (EngineConfig.cpu_kernels=False)"
    expected = [f"native kernels: {off}; block kernels: {off}", bf16_line(native_shaped_folder)]
    assert kernel_lines(caplog) == expected
    assert torch_engine.stats().native_kernels == "off"
    assert native_engine.stats().native_kernels == kernels.status()
    assert set(pieces(torch_engine.model).values()) <= set(NATIVE_PIECES)  # torch pieces only
    assert not torch_engine.runner.backend.native and not torch_engine.runner.native_sampling
    assert native_engine.runner.native_sampling == kernels.available()
    for engine in (torch_engine, native_engine):
        engine.start()
    try:
        reference = logits_of(load_model(native_shaped_folder, torch.bfloat16), ids, native=False)
        expected_first = int(reference[-1].float().argmax())
        assert greedy(torch_engine, ids)[0] == expected_first
        assert greedy(native_engine, ids)[0] == expected_first
    finally:
        for engine in (torch_engine, native_engine):
            engine.stop()
    assert len(kernel_lines(caplog)) == 2  # once per engine start, not per step


def kernel_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The lines logged on "parrot.engine.kernels", each at info level."""
    records = [r for r in caplog.records if r.name == "parrot.engine.kernels"]
    assert all(r.levelno == logging.INFO for r in records)
    return [r.getMessage() for r in records]


def bf16_line(folder: Path) -> str:
    """The line a bf16 engine on the model in `folder` logs at start on this machine."""
    if not kernels.available():
        return f"native kernels: {kernels.status()}; block kernels: off (bfloat16 model)"
    num_pieces = sum(type(m) in NATIVE_PIECES for m in load_model(folder, torch.bfloat16).modules())
    note = f"; {kernels.library.note()}" if kernels.library.note() else ""
    parts = f"linears, attention, elementwise, sampler, fused layers: {num_pieces} modules{note}"
    return f"native kernels: {kernels.status()} ({parts}); block kernels: off (bfloat16 model)"


def test_the_startup_line_names_the_float32_kernels(tiny_model_folder: Path, caplog: pytest.LogCaptureFixture) -> None:
    from parrot.engine.kernels import library

    caplog.set_level(logging.INFO, logger="parrot.engine.kernels")
    LLMEngine(EngineConfig(model=str(tiny_model_folder), dtype="float32", num_blocks=8))
    if library.blocks_library() is None:
        blocks = library.blocks_status()
    else:  # the tiny model's random weights are no block encoding: its linears stay on torch
        pieces = load_model(tiny_model_folder, torch.float32).modules()
        modules = sum(type(m) in ELEMENTWISE_PIECES for m in pieces)
        linears = "linears on torch (unavailable: no weight is an exact Q4_1 or Q8_0 block encoding)"
        blocks = f"avx2_fma ({linears}; attention; elementwise and fused layers: {modules} modules)"
    assert kernel_lines(caplog) == [f"native kernels: off (float32 model); block kernels: {blocks}"]


def test_the_libraries_build_wherever_the_cpu_and_a_compiler_allow() -> None:
    """A C file that stops compiling must fail here, not turn every kernel test into a skip."""
    import shutil

    from parrot.engine.cpu_features import AMX_FLAGS, BF16_DOT_FLAGS, cpu_flags, x86_linux
    from parrot.engine.kernels import library

    if not x86_linux() or (shutil.which("gcc") is None and not os.environ.get("CC")):
        pytest.skip("not an x86-64 Linux machine with a C compiler")
    if not library.BLOCKS_CPU_FLAGS - cpu_flags():
        assert library.blocks_status() == "avx2_fma"
    if not BF16_DOT_FLAGS - cpu_flags():
        assert kernels.status() in ("avx512_bf16+amx", "avx512_bf16"), kernels.status()
        if not AMX_FLAGS - cpu_flags() and kernels.status() == "avx512_bf16+amx":
            assert kernels.attention_amx()  # attention follows the linears onto AMX


def test_build_says_why_the_library_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    from parrot.engine.kernels import library

    monkeypatch.setattr(library, "x86_linux", lambda: True)
    monkeypatch.setattr(library, "cpu_flags", lambda: {"avx512bw", "avx2"})
    assert library.build(library.KERNELS) == (None, "the CPU lacks avx512_bf16, avx512vl")
    assert library.build(library.BLOCKS) == (None, "the CPU lacks fma")
    monkeypatch.setattr(library, "cpu_flags", lambda: {"avx512_bf16", "avx512bw", "avx512vl"})
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(library.shutil, "which", lambda _: None)
    assert library.build(library.KERNELS) == (None, "no C compiler (gcc is not on PATH and $CC is unset)")
    monkeypatch.setattr(library, "x86_linux", lambda: False)
    assert library.build(library.BLOCKS)[1].startswith("not an x86-64 Linux machine")


def test_an_unavailable_library_is_logged_and_reported(
    tiny_model_folder: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from parrot.engine.kernels import library

    # As if this process had tried to build the library and failed.
    monkeypatch.setattr(library, "_tried", True)
    monkeypatch.setattr(library, "_lib", None)
    monkeypatch.setattr(library, "_reason", "no C compiler (gcc is not on PATH and $CC is unset)")
    caplog.set_level(logging.INFO, logger="parrot.engine.kernels")
    with caplog.at_level(logging.INFO, logger="parrot.engine.model_setup"):
        engine = LLMEngine(EngineConfig(model=str(tiny_model_folder), dtype="bfloat16", num_blocks=8))
    status = "unavailable: no C compiler (gcc is not on PATH and $CC is unset)"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"native CPU kernels {status}; running on torch ops"]
    assert kernel_lines(caplog) == [f"native kernels: {status}; block kernels: off (bfloat16 model)"]
    assert engine.stats().native_kernels == status
    assert not engine.runner.backend.native and not engine.runner.native_sampling
