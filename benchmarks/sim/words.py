"""Synthetic text of an exact token count: space-led words that are one token each in the
tokenizer, drawn by a seeded RNG (documents differ, a shared prompt is the same text each time)."""

from __future__ import annotations

import random

from parrot.text import Tokenizer


class Words:
    def __init__(self, tokenizer: Tokenizer, num_words: int = 2000) -> None:
        words = []
        for token_id in range(tokenizer.vocab_size):
            text = tokenizer.decode([token_id])
            if text.startswith(" ") and text[1:].isalpha() and text[1:].islower() and 4 <= len(text) <= 9:
                words.append(text)
            if len(words) >= num_words:
                break
        sample = "".join(words)
        if len(tokenizer.encode(sample)) != len(words):
            raise AssertionError("the word list does not tokenize one token per word")
        self.words = words
        self.tokenizer = tokenizer

    def text(self, seed: str, num_tokens: int) -> str:
        """`num_tokens` words (one token each), the same for the same seed."""
        rng = random.Random(seed)
        return "".join(rng.choices(self.words, k=num_tokens))

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text))
