"""Batched token sampling: greedy, temperature, top-k, top-p, per-request seeds, logprobs, top
alternatives; penalties, logit bias and grammar masks on the rows that ask (logits.py).

One pass over the batch's logits [B, V], no Python loop over the vocabulary. Sampling is by inverse
CDF with one uniform number per row drawn from that request's own generator, so a seeded request
gives the same tokens whatever it is batched with. Adjusted rows are taken out as float32, adjusted
and reduced one row at a time, so they too do not depend on the batch, and the other rows keep
exactly what they would get without them. A logprob (and the top alternatives) is of the adjusted
distribution before temperature: with a grammar, of the tokens it allows.
"""

from __future__ import annotations

import torch

from parrot.engine import kernels
from parrot.engine.logits import adjust, observe
from parrot.engine.sample_row import SampleRow
from parrot.protocol.engine_api import TopLogprob
from parrot.protocol.sampling import SamplingParams

__all__ = ["SampleRow", "new_generator", "sample"]


def new_generator(params: SamplingParams) -> torch.Generator | None:
    if params.greedy:
        return None
    gen = torch.Generator()
    if params.seed is not None:
        gen.manual_seed(params.seed)
    else:
        gen.seed()
    return gen


def sample(
    logits: torch.Tensor, rows: list[SampleRow], native: bool = False, row_invariant: bool = False
) -> tuple[list[int], list[float]]:
    """logits [B, V] (bf16 or float32) -> chosen token ids and their log-probabilities, computed
    in float32 (bf16 logits convert exactly). `native`: the caller's kernel library is built
    (kernels.available()); bf16 logits then take one native argmax + logsumexp pass (per row).
    `row_invariant`: each row's logprob must not depend on B; torch's logsumexp of one row and of
    the same row among others differed here (by a float ulp), so the torch path then reduces row by row."""
    if native and logits.dtype == torch.bfloat16:
        chosen, lse = kernels.argmax_logsumexp(logits)  # one native pass, no float copy
    else:
        logits = logits.float()
        chosen = logits.argmax(dim=-1)
        if row_invariant:
            lse = torch.stack([torch.logsumexp(row, dim=-1) for row in logits])
        else:
            lse = torch.logsumexp(logits, dim=-1)
    adjusted = [i for i, r in enumerate(rows) if r.adjusts]
    if adjusted:
        # Adjusted rows leave the native pass: float32, adjusted, reduced row by row.
        sub = logits[torch.tensor(adjusted)].float()
        adjust(sub, [rows[i] for i in adjusted])
        logits = logits.float()
        for j, i in enumerate(adjusted):
            logits[i] = sub[j]
            chosen[i] = sub[j].argmax()
            lse[i] = torch.logsumexp(sub[j], dim=-1)
    sampled = [i for i, r in enumerate(rows) if not r.params.greedy]
    if sampled:
        idx = torch.tensor(sampled)
        chosen[idx] = _sample_rows(logits[idx].float(), [rows[i] for i in sampled])
    # log p(chosen) = logit - logsumexp(row): no [B, V] log-softmax tensor.
    picked = logits.gather(1, chosen[:, None]).squeeze(1).float() - lse
    tokens, logprobs = chosen.tolist(), picked.tolist()
    vocab = logits.shape[-1]
    for i, r in enumerate(rows):
        if r.params.top_logprobs:
            values, ids = torch.topk(logits[i].float(), r.params.top_logprobs)
            r.top = [
                TopLogprob(token_id=t, logprob=v) for t, v in zip(ids.tolist(), (values - lse[i]).tolist(), strict=True)
            ]
        if r.adjusts:
            observe(r, tokens[i], logprobs[i], vocab)
    return tokens, logprobs


def _sample_rows(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    temps = torch.tensor([r.params.temperature for r in rows], dtype=torch.float32)[:, None]
    probs = torch.softmax(logits / temps, dim=-1)
    # Stable: bf16 logits tie often, and an unstable sort may order tied tokens differently by
    # batch size, which moves the sampled position onto another token.
    sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
    vocab = logits.shape[-1]
    # top-k: keep the first k of the sorted row (0 = all).
    ks = torch.tensor([r.params.top_k or vocab for r in rows])[:, None]
    keep = torch.arange(vocab)[None, :] < ks
    # top-p: keep the smallest head whose mass reaches p (the first token always stays).
    ps = torch.tensor([r.params.top_p for r in rows], dtype=torch.float32)[:, None]
    before = sorted_probs.cumsum(dim=-1) - sorted_probs
    keep &= before < ps
    kept = sorted_probs * keep
    cdf = kept.cumsum(dim=-1)
    u = torch.cat([torch.rand(1, generator=r.generator) for r in rows])[:, None] * cdf[:, -1:]
    pos = torch.searchsorted(cdf, u).clamp_(max=vocab - 1)
    return order.gather(1, pos).squeeze(1)
