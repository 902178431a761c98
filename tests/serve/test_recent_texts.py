"""A plain request's prompt (no known prefix) reuses the tokens of a recent text that began the
same way (parrot/text/recent.py): ids and ends equal the whole text's, exactly, wherever the shared
part ends; only the rest is tokenized; the cache stays within its characters; a hash collision
costs a tokenization, never a wrong token."""

from __future__ import annotations

import random
from pathlib import Path

from test_exact_tokens import corpus_text, fragments

from parrot.text import Tokenizer
from parrot.text.recent import RecentTexts

HARD = ["  ", "\n\n", "'re", "’ll", "<|im_start|>", "<|im_", "é", "中文", "🦜"]


class Counting:
    """The tokenizer's whole-text encoding, recording how many characters each call tokenized."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        self.lengths: list[int] = []

    def __call__(self, text: str) -> tuple[list[int], list[int]]:
        self.lengths.append(len(text))
        return self.tok._encode_whole(text)


def random_text(rng: random.Random, pieces: list[str], n: int) -> str:
    return "".join(rng.choice(pieces) + rng.choice(["", " ", "\n", "  "]) for _ in range(n))


def test_texts_sharing_a_prefix_tokenize_exactly_as_whole_texts(default_model_folder: Path) -> None:
    tok = Tokenizer(default_model_folder)
    rng = random.Random(5)
    pieces = [*fragments(rng, corpus_text(), 300), *HARD]
    recent = RecentTexts(tok.stable_len, 512, 65536, 1 << 20)
    encode = Counting(tok)
    systems = [random_text(rng, pieces, rng.randint(40, 200)) for _ in range(6)]
    for system in systems:  # seen once whole: every later text's shared part has a text to match
        assert recent.encode_offsets(system, encode) == tok._encode_whole(system)
    num_reused = 0
    for _ in range(300):
        system = rng.choice(systems)
        # The shared part ends anywhere: mid-word, in a run of spaces, inside a special token.
        shared = system[: rng.randint(len(system) // 2, len(system))]
        text = shared + random_text(rng, pieces, rng.randint(0, 30))
        whole = tok._encode_whole(text)
        del encode.lengths[:]
        assert recent.encode_offsets(text, encode) == whole, text
        (tokenized,) = encode.lengths
        num_reused += tokenized < len(text)
        if len(shared) >= 2 * 512 and len(text) > 2 * 512:
            assert tokenized <= len(text) - 512, (len(shared), len(text), tokenized)
    assert num_reused > 200


def test_the_tokenizer_reuses_a_plain_prompts_system_prompt(default_model_folder: Path) -> None:
    """Tokenizer.encode_offsets without a known prefix: the second request with the same 5,000
    characters of system prompt tokenizes only what follows its last 512-character mark."""
    tok = Tokenizer(default_model_folder)
    rng = random.Random(6)
    system = random_text(rng, fragments(rng, corpus_text(), 300), 400)[:5000]
    for question in ("What is Parrot?", "And the engine?", " 'll it work?\n\nAssistant:"):
        text = f"{system}\n\nUser: {question}\nAssistant:"
        assert tok.encode_offsets(text) == tok._encode_whole(text)
    assert tok._recent.num_kept == 1  # the later texts added no prefix of 512-character marks
    short = "a short prompt " * 30
    assert tok.encode_offsets(short) == tok._encode_whole(short)
    assert tok._recent.num_kept == 1  # under 512 characters: tokenized whole, not kept


def test_the_cache_keeps_its_characters_and_the_newest_text_holds_a_shared_prefix(default_model_folder: Path) -> None:
    tok = Tokenizer(default_model_folder)
    recent = RecentTexts(tok.stable_len, 512, 65536, 4000)
    encode = Counting(tok)
    shared = "The product's instructions, repeated for every user of it. " * 20  # 1,200 characters
    for i in range(10):
        text = shared + f"user {i}: " + "x" * 600
        assert recent.encode_offsets(text, encode) == tok._encode_whole(text)
        assert recent.num_kept == min(i + 1, 2)  # each 1,800+ characters; at most 4,000 kept
    # The oldest texts went, yet the shared prefix is still found: each new text took it over.
    del encode.lengths[:]
    text = shared + "a last user"
    assert recent.encode_offsets(text, encode) == tok._encode_whole(text)
    (tokenized,) = encode.lengths
    assert tokenized < len(text) - 900


class Colliding(RecentTexts):
    def _digests(self, text: str) -> list[bytes]:
        return [b"same"] * (min(len(text), self._max_prefix) // self._step)


def test_a_digest_collision_tokenizes_the_whole_text(default_model_folder: Path) -> None:
    tok = Tokenizer(default_model_folder)
    recent = Colliding(tok.stable_len, 512, 65536, 1 << 20)
    encode = Counting(tok)
    first, second = "alpha beta gamma " * 80, "delta epsilon zeta " * 80
    assert recent.encode_offsets(first, encode) == tok._encode_whole(first)
    assert recent.encode_offsets(second, encode) == tok._encode_whole(second)
    assert encode.lengths == [len(first), len(second)]  # the second matched no text: tokenized whole


def test_a_text_that_another_extends_is_dropped_and_a_long_text_is_kept_to_its_last_mark(
    default_model_folder: Path,
) -> None:
    """A conversation growing turn by turn: each turn's text takes over every prefix of the one
    before, which no prefix names any more and is dropped. A text is kept to its last 512-character
    mark only (longer prefixes are never matched): a 70,000-character text keeps 65,536."""
    tok = Tokenizer(default_model_folder)
    recent = RecentTexts(tok.stable_len, 512, 65536, 1 << 20)
    encode = Counting(tok)
    text = "System: you are a careful assistant who answers briefly. " * 12
    for turn in range(6):
        text += f"User: question {turn} about the river and the harbor? " * 8
        assert recent.encode_offsets(text, encode) == tok._encode_whole(text)
        assert recent.num_kept == 1
    assert recent.num_chars == len(text) // 512 * 512
    long_text = "lantern meadow " * 4700  # 70,500 characters
    assert recent.encode_offsets(long_text, encode) == tok._encode_whole(long_text)
    assert recent.num_chars == len(text) // 512 * 512 + 65536


def test_the_least_recently_used_text_goes_first_and_no_prefix_names_a_text_gone(default_model_folder: Path) -> None:
    tok = Tokenizer(default_model_folder)
    recent = RecentTexts(tok.stable_len, 512, 65536, 3 * 1024)
    encode = Counting(tok)
    names = ("alpha", "beta", "gamma")
    texts = [f"Document {name}: " + f"the {name} river runs past the harbor. " * 30 for name in names]
    for text in texts:  # each kept to 1,024 characters: all three fit
        assert recent.encode_offsets(text, encode) == tok._encode_whole(text)
    assert recent.num_kept == 3
    again = texts[0][:1100] + " and a new question"  # alpha used again: the most recent now
    assert recent.encode_offsets(again, encode) == tok._encode_whole(again)
    delta = "Document delta: " + "the delta river runs past the harbor. " * 30
    assert recent.encode_offsets(delta, encode) == tok._encode_whole(delta)  # one must go: beta
    del encode.lengths[:]
    for text in texts:
        assert recent.encode_offsets(text, encode) == tok._encode_whole(text)
    alpha, beta, _ = encode.lengths
    assert alpha < len(texts[0]) - 900  # still kept
    assert beta == len(texts[1])  # dropped, and no prefix of it led to a text gone
    named = set(map(id, recent._by_digest.values()))
    assert named == set(recent._seen)  # every digest names a kept text, every kept text is named
