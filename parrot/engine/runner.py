"""The model runner: turns a step plan into one forward pass and samples the chosen rows.

Owned by the engine loop thread. Step metadata (ids, positions, KV slots, attention metadata) is
built once per step from plain lists, then copied to tensors once.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from parrot.engine.attention.base import PagedAttention, SeqSpec
from parrot.engine.kv.cache import KVCache
from parrot.engine.kv.context import ContextTable
from parrot.engine.logits import start_history
from parrot.engine.model.llama import LlamaModel
from parrot.engine.sampler import SampleRow, sample
from parrot.engine.sched.job import Job, ScheduledSeq, StepPlan
from parrot.protocol.engine_api import TopLogprob

SCORE_ROWS = 256  # rows of a scoring fill's logits computed at once (256 x a 49k vocabulary: 50 MB)


class ModelRunner:
    def __init__(
        self,
        model: LlamaModel,
        cache: KVCache,
        backend: PagedAttention,
        contexts: ContextTable,
        native_sampling: bool = False,
        row_invariant: bool = False,
    ) -> None:
        self.model = model
        self.native_sampling = native_sampling  # the native argmax + logsumexp (kernels built)
        self.row_invariant = row_invariant  # sampling reduces each row alone (batch-invariant mode)
        self.cache = cache
        self.backend = backend
        self.contexts = contexts
        self.block_size = cache.block_size

    def row_order(self, plan: StepPlan) -> list[ScheduledSeq]:
        """The plan's computing sequences, decodes (one token after cached ones) first."""
        seqs = [s for s in plan.seqs if s.num_new > 0]
        return sorted(seqs, key=lambda s: not (s.num_new == 1 and self.contexts.get(s.job.context_id).num_computed))

    @torch.inference_mode()
    def run(
        self, seqs: list[ScheduledSeq], interrupt: Callable[[], bool] | None = None
    ) -> tuple[list[int], list[float]]:
        """Compute `seqs` (in row order); returns (token, logprob) for each seq with `sample`.
        Raises StepInterrupted when `interrupt` says so between layers (nothing was applied)."""
        if not seqs:
            return [], []
        bs = self.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        specs: list[SeqSpec] = []
        sample_rows: list[int] = []
        scored: list[tuple[int, Job, int, int]] = []  # (row, scoring job, index in its tokens, that token)
        rows: list[SampleRow] = []
        for s in seqs:
            ctx = self.contexts.get(s.job.context_id)
            start, end = ctx.num_computed, ctx.num_computed + s.num_new
            ids.extend(ctx.tokens[start:end])
            positions.extend(range(start, end))
            table, pos = ctx.block_table, start
            while pos < end:  # one run of slots per block touched, not a Python step per token
                block, offset = divmod(pos, bs)
                n = min(bs - offset, end - pos)
                first = table[block] * bs + offset
                slots.extend(range(first, first + n))
                pos += n
            specs.append(SeqSpec(s.num_new, end, table))
            if s.job.scores is not None:  # a scoring fill: rows whose next token is one of its own
                first = max(start, s.job.score_from - 1)
                last = min(end, s.job.score_from + len(s.job.scores) - 1)
                row0 = len(ids) - s.num_new - start
                scored.extend(
                    (row0 + p, s.job, p + 1 - s.job.score_from, ctx.tokens[p + 1]) for p in range(first, last)
                )
            if s.sample:
                sample_row = s.sampler_job.sample_row
                assert sample_row is not None
                if sample_row.needs_history:
                    start_history(sample_row, ctx.tokens[:end], self.model.cfg.vocab_size)
                sample_rows.append(len(ids) - 1)
                rows.append(sample_row)
        # The step's inputs in one copy: ids, positions and KV slots, one row each of [3, N].
        input_ids, positions_t, slot_mapping = torch.tensor([ids, positions, slots], dtype=torch.long)
        self.backend.prepare(specs, slot_mapping)
        hidden = self.model(input_ids, positions_t, self.backend.forward, interrupt)
        if scored:
            self._score(hidden, scored)
        if not sample_rows:
            return [], []
        if len(sample_rows) < len(ids):  # a pure decode step samples every row: no gather
            hidden = hidden[torch.tensor(sample_rows)]
        logits = self.model.logits(hidden, as_float=False)
        return sample(logits, rows, self.native_sampling, self.row_invariant)

    def _score(self, hidden: torch.Tensor, scored: list[tuple[int, Job, int, int]]) -> None:
        """Each scored row's log-probability of the token after it, into its job's scores (and its
        most likely alternatives, when the job asks), `SCORE_ROWS` rows of logits at a time."""
        for at in range(0, len(scored), SCORE_ROWS):
            part = scored[at : at + SCORE_ROWS]
            rows = torch.tensor([r for r, _, _, _ in part])
            logprobs = torch.log_softmax(self.model.logits(hidden[rows]), dim=-1)
            picked = logprobs[torch.arange(len(part)), torch.tensor([t for _, _, _, t in part])].tolist()
            k = max(job.num_score_top for _, job, _, _ in part)
            values, ids = logprobs.topk(k, dim=-1) if k else (logprobs[:, :0], logprobs[:, :0])
            for (_, job, i, _), value, top_v, top_i in zip(part, picked, values.tolist(), ids.tolist(), strict=True):
                assert job.scores is not None
                job.scores[i] = value
                if job.score_tops is not None:
                    alternatives = zip(top_i[: job.num_score_top], top_v[: job.num_score_top], strict=True)
                    job.score_tops[i] = [TopLogprob(token_id=int(t), logprob=v) for t, v in alternatives]
