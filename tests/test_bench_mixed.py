"""The mixed workload's chats carry the run's salt, as every other text piece of a run does: no run
is served from the prefix cache of an earlier run or of a configuration sharing the server."""

from __future__ import annotations

from pathlib import Path

from benchmarks.apps.workloads import map_reduce, mixed
from benchmarks.apps.workloads.common import Corpus, salt_digits
from benchmarks.data import ChatTurn
from parrot.text import Tokenizer


class ChatCorpus(Corpus):
    def chat_turns(self, n: int, seed: int, max_prompt_tokens: int) -> tuple[ChatTurn, ...]:
        return tuple(ChatTurn(f"c{i}", f"How do parrots learn word {i}?", 9, 40) for i in range(n))


def test_each_runs_chats_begin_the_users_message_with_its_salt(tiny_model_folder: Path) -> None:
    corpus = ChatCorpus(Tokenizer(tiny_model_folder))
    params = mixed.Params(3, 1.0, 64, 4, 8, 0.1, map_reduce.Params(16, 4, 2), (1.0,))
    runs = {key: mixed.chat_prompts(params, corpus.salted(key)) for key in ("mixed/parrot_vllm-0", "mixed/d-0")}
    for key, chats in runs.items():
        assert len(chats) == 3
        for i, (prompt, max_tokens) in enumerate(chats):
            assert f"(run {salt_digits(key)}) How do parrots learn word {i}?" in prompt
            assert max_tokens == 4  # 40 recorded reply tokens x 0.1, clamped to 4-8
    first, second = runs.values()
    assert all(a[0] != b[0] for a, b in zip(first, second, strict=True))  # no prompt shared between runs
    tok = corpus.tokenizer
    assert [len(tok.encode(p)) for p, _ in first] == [len(tok.encode(p)) for p, _ in second]  # equal lengths
