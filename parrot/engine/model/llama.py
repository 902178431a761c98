"""LLaMA-family decoder (LLaMA, Mistral, Qwen2-style QKV bias) over a flat batch of tokens.

The model sees one flat row per new token of the step: [N, hidden]. Attention is not its business:
it calls `attend(layer, q, k, v)`, which the engine's attention backend provides (it owns the KV
cache writes and reads). Its pieces (projections, norms, activation, rotary, LM head: layers.py,
rope.py) run plain torch ops; speed-ups are transforms applied to the loaded model that swap them
(`parrot.engine.kernels.apply_native`). This file imports only torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
from torch import nn

from parrot.engine.model.config import ModelConfig
from parrot.engine.model.layers import Linear, LMHead, RMSNorm, SiluMul
from parrot.engine.model.rope import Rotary, RotaryStep, cos_sin_table, inv_freq

# attend(layer_idx, q [N, Hq, D], k [N, Hkv, D], v [N, Hkv, D]) -> [N, Hq * D]
AttendFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        q_dim, kv_dim = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.qkv = Linear(cfg.hidden_size, q_dim + 2 * kv_dim, bias=cfg.qkv_bias)
        self.o = Linear(q_dim, cfg.hidden_size, bias=False)
        self.gate_up = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.silu_mul = SiluMul()
        self.qk_v = (q_dim + kv_dim, kv_dim)

    def forward(
        self,
        idx: int,
        x: torch.Tensor,
        h: torch.Tensor,
        rotary: RotaryStep,
        attend: AttendFn,
        next_norm: RMSNorm,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x: the residual stream [N, hidden]; h = input_norm(x); rotary: this step's positions.
        Returns the new residual and `next_norm` of it (the next layer's input norm, or the final
        norm), each residual add fused with the norm after it."""
        cfg, n = self.cfg, x.shape[0]
        qk, v = self.qkv(h).split(self.qk_v, dim=-1)
        # One rotary op over the q and k heads together: [N, Hq + Hkv, D].
        qk = rotary.apply(qk.view(n, cfg.num_heads + cfg.num_kv_heads, cfg.head_dim))
        q, k = qk.split((cfg.num_heads, cfg.num_kv_heads), dim=1)
        v = v.view(n, cfg.num_kv_heads, cfg.head_dim)
        x, h = self.post_attn_norm.add_and_norm(x, self.o(attend(idx, q, k, v)))
        mlp = self.down(self.silu_mul(self.gate_up(h)))
        return next_norm.add_and_norm(x, mlp)


class StepInterrupted(Exception):
    """A forward pass stopped between layers (its step is planned again)."""


class LlamaModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = LMHead(cfg.hidden_size, cfg.vocab_size, tied=cfg.tie_word_embeddings)
        cos, sin = cos_sin_table(cfg.max_position_embeddings, inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling))
        self.rotary = Rotary(cos, sin)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attend: AttendFn,
        interrupt: Callable[[], bool] | None = None,
    ) -> torch.Tensor:
        """input_ids, positions [N] -> final-normed hidden states [N, hidden]. `interrupt` is asked
        between layers; when it says so the pass stops with StepInterrupted (the KV it wrote lies
        past every context's computed tokens: nothing reads it before it is written again)."""
        x = self.embed(input_ids)
        layers = [cast(DecoderLayer, layer) for layer in self.layers]
        h = layers[0].input_norm(x)
        rotary = self.rotary.at(positions)  # tables gathered once for all layers
        for i, layer in enumerate(layers):
            if interrupt is not None and i and interrupt():
                raise StepInterrupted(i)
            next_norm = layers[i + 1].input_norm if i + 1 < len(layers) else self.norm
            x, h = layer(i, x, h, rotary, attend, next_norm)
        return h

    def logits(self, hidden: torch.Tensor, as_float: bool = True) -> torch.Tensor:
        """hidden [n, hidden] -> logits [n, vocab], float32 (or the model's dtype)."""
        out = self.lm_head(hidden, self.embed.weight)
        return out.float() if as_float else out

    @torch.no_grad()
    def load_hf_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        """Load Hugging Face LLaMA names, fusing q/k/v and gate/up into single matmuls."""
        dtype = self.embed.weight.dtype

        def take(name: str) -> torch.Tensor:
            if name not in tensors:
                raise KeyError(f"weight {name!r} missing from checkpoint")
            return tensors[name].to(dtype)

        self.embed.weight.copy_(take("model.embed_tokens.weight"))
        self.norm.weight.copy_(take("model.norm.weight"))
        if self.lm_head.weight is not None:
            name = "lm_head.weight" if "lm_head.weight" in tensors else "model.embed_tokens.weight"
            self.lm_head.weight.copy_(take(name))
        for i in range(len(self.layers)):
            layer = cast(DecoderLayer, self.layers[i])
            p = f"model.layers.{i}."
            attn = [take(f"{p}self_attn.{n}_proj.weight") for n in "qkv"]
            layer.qkv.weight.copy_(torch.cat(attn))
            if layer.qkv.bias is not None:
                layer.qkv.bias.copy_(torch.cat([take(f"{p}self_attn.{n}_proj.bias") for n in "qkv"]))
            layer.o.weight.copy_(take(f"{p}self_attn.o_proj.weight"))
            layer.gate_up.weight.copy_(torch.cat([take(f"{p}mlp.gate_proj.weight"), take(f"{p}mlp.up_proj.weight")]))
            layer.down.weight.copy_(take(f"{p}mlp.down_proj.weight"))
            layer.input_norm.weight.copy_(take(f"{p}input_layernorm.weight"))
            layer.post_attn_norm.weight.copy_(take(f"{p}post_attention_layernorm.weight"))
