"""Batch-invariant mode in bf16 (`EngineConfig.batch_invariant`): a sequence's tokens and logprobs
are bit-identical alone, in a concurrent batch, from a forked prefix, with chunked prefill and
after generated tokens (as if they had been filled); and
the row-invariant linear gives each row the same bits at every row count."""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import pytest
import torch

from parrot import cli
from parrot.engine import kernels, sync_client
from parrot.engine.config import EngineConfig
from parrot.engine.llm_engine import LLMEngine
from parrot.engine.model.loader import write_tiny_model
from parrot.protocol import ExtendRequest, FreeContextRequest, SamplingParams

Output = tuple[list[int], list[float]]
GREEDY = SamplingParams(max_tokens=8, ignore_eos=True)


def seeded(i: int) -> SamplingParams:
    return SamplingParams(max_tokens=8, ignore_eos=True, temperature=1.0, top_p=0.9, seed=i)


@pytest.fixture(scope="module")
def bf16_model_folder(tmp_path_factory: pytest.TempPathFactory, default_model_folder: Path) -> Path:
    """The tiny model with head_dim 32, the smallest the native attention and RoPE kernels take."""
    return write_tiny_model(
        tmp_path_factory.mktemp("models") / "tiny32", tokenizer_from=default_model_folder, head_dim=32
    )


@pytest.fixture(scope="module", params=[True, False], ids=["native", "torch"])
def engine(request: pytest.FixtureRequest, bf16_model_folder: Path) -> object:
    if request.param and not kernels.available():
        pytest.skip(f"native kernels {kernels.status()}")
    config = EngineConfig(
        model=str(bf16_model_folder), dtype="bfloat16", batch_invariant=True, cpu_kernels=request.param
    )
    eng = LLMEngine(config)
    eng.start()
    yield eng
    eng.stop()


def prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 40000) for _ in range(n)]


def outputs(events: list) -> Output:
    return [e.token_id for e in events if e.token_id is not None], [e.logprob for e in events]


def alone(engine: LLMEngine, tokens: list[int], sampling: SamplingParams) -> Output:
    sync_client.extend_only(engine, ExtendRequest(context_id="alone", token_ids=tokens))
    out = outputs(sync_client.extend(engine, ExtendRequest(context_id="alone", append=True, sampling=sampling)))
    engine.free(FreeContextRequest(context_id="alone"))
    return out


def together(
    engine: LLMEngine, tokens: list[list[int]], samplings: list[SamplingParams], parent: str | None = None
) -> list[Output]:
    """All at once: each fill and generate submitted before any is awaited (one batch)."""
    handles = []
    for i, t in enumerate(tokens):
        sync_client.submit(engine, ExtendRequest(context_id=f"c{i}", token_ids=t, parent_context_id=parent))
        handles.append(
            sync_client.submit(engine, ExtendRequest(context_id=f"c{i}", append=True, sampling=samplings[i]))
        )
    outs = [outputs(sync_client.wait(h)) for h in handles]
    for i in range(len(tokens)):
        engine.free(FreeContextRequest(context_id=f"c{i}"))
    return outs


@pytest.mark.parametrize(
    ("n", "k", "layout"),
    [
        (64, 96, "amx"),  # AMX tiles where AMX runs (else VNNI)
        (48, 80, "vnni"),  # not a 32-multiple: the VNNI kernel everywhere
        (13, 80, None),  # N = 13: the dot kernel, 1 column left over
    ],
)
def test_row_invariant_linear_is_bit_identical_at_every_row_count(n: int, k: int, layout: str | None) -> None:
    if not kernels.available():
        pytest.skip(f"native kernels {kernels.status()}")
    gen = torch.Generator().manual_seed(0)
    rows = 300  # AMX: 128-row panels of 16-row blocks, a partial last block; VNNI: 48-row panels of 6-row blocks
    x = torch.randn(rows, k, generator=gen).bfloat16()
    w = torch.randn(n, k, generator=gen).bfloat16()
    b = torch.randn(n, generator=gen).bfloat16()
    packed = kernels.pack_row_invariant(w)
    expected = {"amx": 5 if kernels.amx_available() else 4, "vnni": 4, None: None}[layout]
    assert (None if packed is None else packed.dim()) == expected
    with torch.inference_mode():
        ref = torch.cat([kernels.linear(x[i : i + 1], w, b, packed, row_invariant=True) for i in range(rows)])
        for m in [*range(1, 40), 47, 48, 49, 127, 128, 129, 255, 256, 257, 299, 300]:
            assert torch.equal(kernels.linear(x[:m], w, b, packed, row_invariant=True), ref[:m]), m
            assert torch.equal(kernels.linear(x[rows - m :], w, b, packed, row_invariant=True), ref[rows - m :]), m
        assert (ref.float() - torch.nn.functional.linear(x.float(), w.float(), b.float())).abs().max() < 0.25


def test_rowwise_linear_fallback_is_per_row() -> None:
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(9, 80, generator=gen).bfloat16(), torch.randn(13, 80, generator=gen).bfloat16()
    for i in range(9):
        assert torch.equal(kernels.rowwise_linear(x, w)[i], kernels.rowwise_linear(x[i : i + 1], w)[0])


def test_alone_equals_concurrent_batch(engine: LLMEngine) -> None:
    prompts = [prompt(i, 5 + 53 * i) for i in range(12)]  # 5 .. 588 tokens
    samplings = [GREEDY if i % 2 else seeded(i) for i in range(12)]
    expected = [alone(engine, p, s) for p, s in zip(prompts, samplings, strict=True)]
    assert together(engine, prompts, samplings) == expected


def test_forked_prefix_equals_one_fill(engine: LLMEngine) -> None:
    prefix = prompt(100, 301)  # not a multiple of the block size: the fork copies a partial block
    suffixes = [prompt(200 + i, 3 + 37 * i) for i in range(8)]
    samplings = [GREEDY if i % 2 else seeded(i) for i in range(8)]
    expected = [alone(engine, prefix + s, sp) for s, sp in zip(suffixes, samplings, strict=True)]
    sync_client.extend_only(engine, ExtendRequest(context_id="prefix", token_ids=prefix))
    try:
        assert together(engine, suffixes, samplings, parent="prefix") == expected
    finally:
        engine.free(FreeContextRequest(context_id="prefix"))


def test_chunked_prefill_equals_one_shot(engine: LLMEngine, bf16_model_folder: Path) -> None:
    """A 7-token step budget cuts prompts into chunks of every size (1-token chunks included)."""
    config = EngineConfig(
        model=str(bf16_model_folder),
        dtype="bfloat16",
        batch_invariant=True,
        cpu_kernels=engine.config.cpu_kernels,
        max_num_batched_tokens=7,
        latency_prefill_tokens=None,
    )
    chunked = LLMEngine(config)
    chunked.start()
    try:
        prompts = [prompt(300 + i, 9 + 100 * i) for i in range(4)]  # up to 309 tokens
        samplings = [GREEDY, seeded(1), GREEDY, seeded(3)]
        expected = [alone(engine, p, s) for p, s in zip(prompts, samplings, strict=True)]
        assert together(chunked, prompts, samplings) == expected
    finally:
        chunked.stop()


def test_generated_tokens_continue_like_the_same_tokens_filled(engine: LLMEngine) -> None:
    """A multi-output template: text appended after generated tokens continues exactly as the whole
    text filled in one piece (generated tokens' K/V come from decode rows, filled ones from
    prefill chunks: the same bits)."""
    head, tail = prompt(400, 150), prompt(401, 90)
    sync_client.extend_only(engine, ExtendRequest(context_id="turns", token_ids=head))
    try:
        first = outputs(sync_client.extend(engine, ExtendRequest(context_id="turns", append=True, sampling=GREEDY)))[0]
        sync_client.extend_only(engine, ExtendRequest(context_id="turns", token_ids=tail, append=True))
        second = outputs(sync_client.extend(engine, ExtendRequest(context_id="turns", append=True, sampling=GREEDY)))
    finally:
        engine.free(FreeContextRequest(context_id="turns"))
    assert len(first) == 8 and len(second[0]) == 8
    assert alone(engine, head + first + tail, GREEDY) == second


def test_engine_reports_the_mode_and_the_cli_sets_it(engine: LLMEngine) -> None:
    assert engine.stats().batch_invariant
    assert engine.runner.backend.name == "rowwise"  # the configured shared-prefix cascade is replaced
    parser = argparse.ArgumentParser()
    cli._engine_args(parser)
    assert cli._engine_config(parser.parse_args(["--batch-invariant"])).batch_invariant is True
    assert cli._engine_config(parser.parse_args(["--no-batch-invariant"])).batch_invariant is False
    assert cli._engine_config(parser.parse_args([])).batch_invariant is None  # on where the kernels run


def test_default_is_on_where_the_kernels_run_linears_and_attention(
    bf16_model_folder: Path, tiny_model_folder: Path
) -> None:
    """head_dim 16 is too small for the native attention: the default leaves the mode off there."""
    on = kernels.available()
    assert LLMEngine(EngineConfig(model=str(bf16_model_folder), dtype="bfloat16")).batch_invariant == on
    assert not LLMEngine(EngineConfig(model=str(tiny_model_folder), dtype="bfloat16")).batch_invariant
    assert not LLMEngine(EngineConfig(model=str(bf16_model_folder), dtype="float32")).batch_invariant
    assert not LLMEngine(EngineConfig(model=str(bf16_model_folder), cpu_kernels=False)).batch_invariant
