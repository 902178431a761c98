"""Greedy output equals Hugging Face transformers' on the real default model (fp32; on an AVX2 CPU
its decode steps run the block kernels, which multiply by the same float32 weights)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from parrot.engine import kernels, sync_client
from parrot.engine.config import EngineConfig
from parrot.engine.kernels import library
from parrot.engine.llm_engine import LLMEngine
from parrot.protocol import ExtendRequest, SamplingParams

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in two sentences.",
    "List three prime numbers and say why they are prime.",
    "Translate 'good morning' into Spanish and German.",
    "What does a compiler do?",
]
NEW_TOKENS = 40


@pytest.mark.slow
def test_greedy_tokens_equal_transformers(default_model_folder: Path) -> None:
    from transformers import AutoModelForCausalLM

    engine = LLMEngine(EngineConfig(model=str(default_model_folder), dtype="float32"))
    engine.start()
    try:
        if library.blocks_library() is not None:  # decode steps multiply by the GGUF's blocks
            assert engine.stats().native_kernels.startswith("avx2_fma blocks: 121 of 121 weights")
        tok = engine.tokenizer
        prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}])) for q in QUESTIONS]
        sampling = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
        # All prompts at once: batching and ragged lengths must not change any token.
        for i, p in enumerate(prompts):
            sync_client.submit(engine, ExtendRequest(context_id=f"q{i}", token_ids=p))
        handles = [
            sync_client.submit(engine, ExtendRequest(context_id=f"q{i}", append=True, sampling=sampling))
            for i in range(len(prompts))
        ]
        ours = [sync_client.token_ids(sync_client.wait(h)) for h in handles]
    finally:
        engine.stop()

    hf = AutoModelForCausalLM.from_pretrained(default_model_folder, dtype=torch.float32).eval()
    # Like ignore_eos: keep decoding greedily through EOS (min_new_tokens would mask EOS instead).
    hf.generation_config.eos_token_id = None
    for p, mine in zip(prompts, ours, strict=True):
        with torch.no_grad():
            out = hf.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
        assert mine == out[0, len(p) :].tolist()
    assert "Paris" in tok.decode(ours[0])


@pytest.mark.slow
def test_bf16_logits_bit_identical_to_transformers(default_model_folder: Path) -> None:
    """bf16 is the default dtype: its rounding must follow the reference op for op (a fused
    RMSNorm once flipped the greedy answer to this very question)."""
    from transformers import AutoModelForCausalLM

    from parrot.engine.attention.base import PagedAttention, SeqSpec
    from parrot.engine.kv.cache import KVCache
    from parrot.engine.model.loader import load_model
    from parrot.text import Tokenizer

    tok = Tokenizer(default_model_folder)
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": QUESTIONS[0]}]))
    model = load_model(default_model_folder, torch.bfloat16)
    cfg = model.cfg
    cache = KVCache(cfg.num_layers, 8, 16, cfg.num_kv_heads, cfg.head_dim, torch.bfloat16)
    backend = PagedAttention(cache, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
    n = len(ids)
    backend.prepare([SeqSpec(n, n, list(range(8)))], torch.arange(n))
    hf = AutoModelForCausalLM.from_pretrained(default_model_folder, dtype=torch.bfloat16).eval()
    # The loaded model without the native transform (the kernels round differently, by design).
    with torch.no_grad():
        ours = model.logits(model(torch.tensor(ids), torch.arange(n), backend.forward)[-1:])
        theirs = hf(torch.tensor([ids])).logits[0, -1:].float()
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    assert tok.decode([int(ours.argmax())]).strip() == "The"


@pytest.mark.slow
def test_bf16_native_kernels_keep_the_greedy_answer(default_model_folder: Path) -> None:
    """The default engine (bf16, native small-batch kernels) decodes step by step through the
    kernels; its greedy answer follows transformers' bf16 answer token for token at the start
    (bf16 runs drift apart later whatever the kernels, see FIELD_NOTES) and stays right."""
    from transformers import AutoModelForCausalLM

    engine = LLMEngine(EngineConfig(model=str(default_model_folder), dtype="bfloat16"))
    engine.start()
    try:
        assert engine.stats().native_kernels == kernels.status()
        tok = engine.tokenizer
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": QUESTIONS[0]}]))
        sync_client.extend_only(engine, ExtendRequest(context_id="q", token_ids=ids))
        sampling = SamplingParams(max_tokens=16, ignore_eos=True)
        ours = sync_client.token_ids(
            sync_client.extend(engine, ExtendRequest(context_id="q", append=True, sampling=sampling))
        )
    finally:
        engine.stop()
    hf = AutoModelForCausalLM.from_pretrained(default_model_folder, dtype=torch.bfloat16).eval()
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False, pad_token_id=0)
    assert ours == out[0, len(ids) :].tolist()
    assert "Paris" in tok.decode(ours)
