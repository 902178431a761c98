"""Prefix hashing: where a call's prompt may share KV with other calls, and which of those places
are worth keeping as cached prefix contexts. Pure functions over token ids.

A *prefix point* is a position in a prompt (a token count) with the prefix hash of every token
before it. Points sit at each Semantic Variable boundary (the end of every text piece and of every
input value, so prefixes built from generated values are found too, as in multi-agent apps whose
roles share a generated design), and, for plain OpenAI-compatible requests, at chat-message
boundaries and every `block_tokens` tokens (as vLLM's automatic prefix caching does). The prompt
is tokenized whole, so a variable boundary falls at a token boundary near it: runtime/render.py
says which (the nearest at or before it, and the stable one).

The hash of a point depends only on the model and the tokens before it, never on where other
boundaries fell: tokens are chained in fixed groups of `_GROUP` and the tail is hashed with its
length. So two calls with the same first n tokens agree on the hash at n, whatever their templates,
and calls of different models never agree.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from hashlib import blake2b

_GROUP = 16  # tokens per link of the hash chain
_ITEM = 8  # bytes per token id in a link (int64)


class PointKind(StrEnum):
    VARIABLE = "variable"  # at the end of a template piece (constant text or a variable's value)
    MESSAGE = "message"  # end of a chat message (plain chat requests)
    BLOCK = "block"  # a fixed token-block boundary (plain requests)


@dataclass(frozen=True, slots=True)
class PrefixPoint:
    num_tokens: int
    prefix_hash: str
    kind: PointKind


def prefix_points(
    model: str, token_ids: Sequence[int], boundaries: Sequence[tuple[int, PointKind]]
) -> tuple[PrefixPoint, ...]:
    """Points at `boundaries` (positions in 1..len(token_ids), any order; a position given twice
    keeps its first kind). One hash per `_GROUP` tokens up to the last boundary: blake2b (16 bytes)
    of the previous link and the group's ids as int64, a tail also with its length (2 bytes)."""
    kinds: dict[int, PointKind] = {}
    for n, kind in boundaries:
        if not 0 < n <= len(token_ids):
            raise ValueError(f"boundary {n} is outside the prompt of {len(token_ids)} tokens")
        kinds.setdefault(n, kind)
    if not kinds:
        return ()
    raw = memoryview(array("q", token_ids[: max(kinds)]).tobytes())  # converted once, sliced per link
    width = _ITEM * _GROUP
    out: list[PrefixPoint] = []
    chain = [blake2b(model.encode(), digest_size=16).digest()]  # chain[k]: tokens[: k * _GROUP]
    for n in sorted(kinds):
        while len(chain) <= n // _GROUP:
            k = len(chain) - 1
            chain.append(blake2b(chain[k] + raw[k * width : (k + 1) * width], digest_size=16).digest())
        k = n // _GROUP
        if n == k * _GROUP:
            digest = chain[k]
        else:
            tail = raw[k * width : n * _ITEM].tobytes() + (n - k * _GROUP).to_bytes(2, "little")
            digest = blake2b(chain[k] + tail, digest_size=16).digest()
        out.append(PrefixPoint(n, digest.hex(), kinds[n]))
    return tuple(out)


def block_boundaries(num_tokens: int, block_tokens: int) -> list[tuple[int, PointKind]]:
    return [(n, PointKind.BLOCK) for n in range(block_tokens, num_tokens + 1, block_tokens)]


def chat_message_boundaries(
    prompt_ids: Sequence[int], message_prefix_ids: Sequence[Sequence[int]]
) -> list[tuple[int, PointKind]]:
    """Message boundaries: the token counts of the rendered leading messages (messages[:1],
    messages[:2], ...) that are a prefix of the prompt's tokens (a boundary where tokenization
    merged across messages is no boundary)."""
    out: list[tuple[int, PointKind]] = []
    for ids in message_prefix_ids:
        n = len(ids)
        if 0 < n < len(prompt_ids) and list(prompt_ids[:n]) == list(ids):
            out.append((n, PointKind.MESSAGE))
    return out


def choose_cache_points(
    points: Sequence[PrefixPoint],
    *,
    hit_tokens: int,
    num_sharers: Callable[[str], int],
    min_tokens: int,
    include_deepest: bool,
) -> tuple[PrefixPoint, ...]:
    """The points (beyond the cached `hit_tokens`) at which to create cached prefix contexts.

    - the first structural point (the template's leading piece; for chat, the system message): the
      part most likely shared by later sessions of the same application;
    - the last message point of a chat (the conversation so far: the next turn extends it);
    - the longest point another known call shares (`num_sharers(hash) >= 2`);
    - with `include_deepest`, the longest point (an early fill's ready prefix, which the call forks
      from when it runs; a completion's longest block prefix).
    Points shorter than `min_tokens` never are. Returned in prompt order.
    """
    structural = [p for p in points if p.kind is not PointKind.BLOCK] or list(points)
    chosen: set[PrefixPoint] = set()
    if structural:
        chosen.add(structural[0])
    messages = [p for p in points if p.kind is PointKind.MESSAGE]
    if messages:
        chosen.add(messages[-1])
    shared = [p for p in points if num_sharers(p.prefix_hash) >= 2]
    if shared:
        chosen.add(shared[-1])
    if include_deepest and points:
        chosen.add(points[-1])
    return tuple(
        sorted(
            (p for p in chosen if p.num_tokens > hit_tokens and p.num_tokens >= min_tokens), key=lambda p: p.num_tokens
        )
    )
