"""The model code against transformers on tiny random LLaMA-family variants (fp32, exact-ish):
untied embeddings, llama3 rope scaling, Qwen2-style QKV bias, and the GGUF path of the default."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from parrot.engine.attention.base import PagedAttention, SeqSpec
from parrot.engine.kv.cache import KVCache
from parrot.engine.model.config import ModelConfig
from parrot.engine.model.loader import load_model


def our_logits(folder: Path, ids: list[int]) -> torch.Tensor:
    model = load_model(folder, torch.float32)
    cfg = model.cfg
    cache = KVCache(cfg.num_layers, 4, 16, cfg.num_kv_heads, cfg.head_dim, torch.float32)
    backend = PagedAttention(cache, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
    n = len(ids)
    backend.prepare([SeqSpec(n, n, [0, 1, 2, 3])], torch.arange(n))
    with torch.no_grad():
        return model.logits(model(torch.tensor(ids), torch.arange(n), backend.forward))


def rope_kind(hf_cfg: object) -> str:
    params = getattr(hf_cfg, "rope_parameters", None) or {}
    return "rope" if params.get("rope_type", "default") != "default" else ""


@pytest.mark.parametrize(
    "variant",
    [
        {"tie_word_embeddings": False},
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            }
        },
        {"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
        {"qwen2": True},
    ],
    ids=["untied", "llama3_rope", "linear_rope", "qwen2_bias"],
)
def test_variant_matches_transformers(tmp_path: Path, variant: dict) -> None:
    import transformers

    torch.manual_seed(0)
    common = dict(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_theta=10000.0,
    )
    variant = dict(variant)
    if variant.pop("qwen2", False):
        hf_cfg = transformers.Qwen2Config(**common, tie_word_embeddings=False)
        hf = transformers.Qwen2ForCausalLM(hf_cfg)
    else:
        rope = variant.pop("rope_scaling", None)
        hf_cfg = transformers.LlamaConfig(**common, **variant)
        if rope is not None:
            hf_cfg.rope_parameters = {"rope_theta": 10000.0, **rope}
        hf = transformers.LlamaForCausalLM(hf_cfg)
    with torch.no_grad():  # random biases and norms, so they matter
        for name, p in hf.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.normal_(1.0 if "norm" in name else 0.0, 0.2)
    hf.eval().save_pretrained(tmp_path)
    cfg = ModelConfig.from_folder(tmp_path)
    assert cfg.qkv_bias == isinstance(hf, transformers.Qwen2ForCausalLM)
    assert (cfg.rope_scaling is not None) == ("rope" in rope_kind(hf_cfg))
    assert cfg.tie_word_embeddings == bool(hf_cfg.tie_word_embeddings)
    ids = list(range(3, 43))
    with torch.no_grad():
        theirs = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(our_logits(tmp_path, ids), theirs, rtol=1e-4, atol=1e-4)
