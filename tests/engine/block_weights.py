"""Float32 weights that are exact GGUF block encodings (Q4_1, Q8_0), made as gguf's dequantizer
makes them, and a tiny model made of them: what the float32 block kernels take (blocks.py)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from parrot.engine.model.loader import load_model


def q4_1_weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """A float32 weight that is exactly Q4_1, made as gguf's dequantizer makes one: fp32(d * q) + m."""
    gen = torch.Generator().manual_seed(seed)
    d = (torch.rand(n, k // 32, 1, generator=gen) * 0.01 + 1e-4).half().float()
    m = (-torch.rand(n, k // 32, 1, generator=gen) * 0.08).half().float()
    q = torch.randint(0, 16, (n, k // 32, 32), generator=gen).float()
    q[..., 0], q[..., 1] = 0, 15  # as the quantizer makes them: the block's extremes
    return (d * q + m).reshape(n, k)


def q8_0_weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    d = (torch.rand(n, k // 32, 1, generator=gen) * 0.01 + 1e-4).half().float()
    q = torch.randint(-127, 128, (n, k // 32, 32), generator=gen).float()
    q[..., 0] = 127
    return (d * q).reshape(n, k)


def make_blocks(model: nn.Module) -> nn.Module:
    """Every projection of `model` made exactly Q4_1 and its embedding exactly Q8_0, in place."""
    with torch.no_grad():
        for i, (name, p) in enumerate(model.named_parameters()):
            if p.dim() == 2:
                n, k = p.shape
                p.copy_(q8_0_weight(n, k, seed=i) if name == "embed.weight" else q4_1_weight(n, k, seed=i))
    return model


def block_model(folder: Path) -> nn.Module:
    """The model at `folder`, loaded in float32, made of block encodings (`make_blocks`)."""
    return make_blocks(load_model(folder, torch.float32))


def write_block_weights(folder: Path) -> Path:
    """Rewrite a Hugging Face folder's weights (`write_tiny_model`'s) as block encodings: every
    projection exactly Q4_1, the embedding exactly Q8_0 (a float32 engine loading it runs the block
    kernels)."""
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    for i, name in enumerate(sorted(tensors)):
        t = tensors[name]
        if t.dim() == 2:
            make = q8_0_weight if name == "model.embed_tokens.weight" else q4_1_weight
            tensors[name] = make(*t.shape, seed=i).contiguous()
    save_file(tensors, str(path))
    return folder
