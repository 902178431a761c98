"""Per-request logit adjustments, applied to the rows that ask for them before a token is chosen.

In order: `logit_bias`, the repetition penalty (prompt and output tokens), the presence and
frequency penalties (output tokens), then the grammar mask (disallowed tokens to -inf). Each is an
elementwise operation on one row, so a row's result does not depend on the batch. The state they
read lives on the request's `SampleRow` and is updated by `observe` as each token is chosen: a [V]
count of output tokens, a [V] mask of tokens seen, the grammar's matcher. No per-step Python walk
over a request's tokens.
"""

from __future__ import annotations

import torch

from parrot.engine.sample_row import SampleRow


def adjust(logits: torch.Tensor, rows: list[SampleRow]) -> None:
    """logits [n, V] float32, one row per entry of `rows`; changed in place."""
    vocab = logits.shape[-1]
    constrained: list[int] = []
    for i, row in enumerate(rows):
        p, x = row.params, logits[i]
        if p.logit_bias:
            if row.bias_ids is None:
                row.bias_ids = torch.tensor(list(p.logit_bias), dtype=torch.long)
                row.bias_values = torch.tensor(list(p.logit_bias.values()), dtype=torch.float32)
            assert row.bias_values is not None
            x.index_add_(0, row.bias_ids, row.bias_values)
        if p.repetition_penalty != 1.0 and row.seen is not None:
            r = p.repetition_penalty
            x.copy_(torch.where(row.seen, torch.where(x > 0, x / r, x * r), x))
        if (p.presence_penalty or p.frequency_penalty) and row.counts is not None:
            x -= p.presence_penalty * (row.counts > 0) + p.frequency_penalty * row.counts
        if row.matcher is not None:
            constrained.append(i)
    if constrained:
        import xgrammar as xgr

        bitmask = xgr.allocate_token_bitmask(len(constrained), vocab)
        for j, i in enumerate(constrained):
            # A grammar that accepted its end (the stop token) has no next mask: the row's
            # generation ends with that token, so it is sampled again only by a caller that
            # ignores the end (a benchmark); its row stays unmasked (all ones).
            if not rows[i].matcher.is_terminated():
                rows[i].matcher.fill_next_token_bitmask(bitmask, j)
        sub = logits[constrained]
        xgr.apply_token_bitmask_inplace(sub, bitmask, vocab_size=vocab)
        logits[constrained] = sub


def start_history(row: SampleRow, token_ids: list[int], vocab_size: int) -> None:
    """Before a request's first token: the prompt's tokens for the repetition penalty."""
    row.seen = torch.zeros(vocab_size, dtype=torch.bool)
    if token_ids:
        row.seen[torch.tensor(token_ids, dtype=torch.long)] = True


def observe(row: SampleRow, token_id: int, logprob: float, vocab_size: int) -> None:
    """The request chose `token_id`: advance its matcher and its token counts."""
    p = row.params
    row.logprob_sum += logprob
    if row.matcher is not None and not row.matcher.is_terminated():
        row.matcher.accept_token(token_id)
    if p.presence_penalty or p.frequency_penalty:
        if row.counts is None:
            row.counts = torch.zeros(vocab_size, dtype=torch.float32)
        row.counts[token_id] += 1.0
    if row.seen is not None:
        row.seen[token_id] = True
