"""Prefix hashing and the choice of cache points: exact outcomes on hand-built token lists."""

from __future__ import annotations

import pytest

from parrot.serve.policy.prefix import (
    PointKind,
    PrefixPoint,
    block_boundaries,
    chat_message_boundaries,
    choose_cache_points,
    prefix_points,
)

V, M, B = PointKind.VARIABLE, PointKind.MESSAGE, PointKind.BLOCK


def test_a_hash_depends_only_on_the_model_and_the_tokens_before_it() -> None:
    tokens = list(range(100, 170))
    a = prefix_points("m", tokens, [(5, V), (20, V), (40, V), (70, V)])
    b = prefix_points("m", [*tokens[:40], 1, 2, 3], [(16, B), (40, M), (43, V)])
    c = prefix_points("other", tokens, [(40, V)])
    assert [p.num_tokens for p in a] == [5, 20, 40, 70]
    assert [(p.num_tokens, p.kind) for p in b] == [(16, B), (40, M), (43, V)]
    # Same first 40 tokens, different boundaries before: same hash at 40; never across models.
    assert a[2].prefix_hash == b[1].prefix_hash
    assert c[0].prefix_hash != a[2].prefix_hash
    assert len({p.prefix_hash for p in a + b}) == 6
    # A group-aligned point hashes differently from the same tokens plus one.
    assert prefix_points("m", tokens, [(32, B)])[0].prefix_hash != prefix_points("m", tokens, [(33, B)])[0].prefix_hash


def test_boundaries() -> None:
    assert block_boundaries(130, 64) == [(64, B), (128, B)]
    assert block_boundaries(63, 64) == []
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    # messages[:1] and messages[:2] render to prefixes; a merged tokenization is no boundary,
    # nor is the whole prompt.
    assert chat_message_boundaries(prompt, [[1, 2, 3], [1, 2, 9], [1, 2, 3, 4, 5], prompt]) == [(3, M), (5, M)]
    # Repeated positions keep their first kind; positions must lie in the prompt.
    points = prefix_points("m", prompt, [(4, M), (4, B), (8, V)])
    assert [(p.num_tokens, p.kind) for p in points] == [(4, M), (8, V)]
    with pytest.raises(ValueError, match="outside the prompt"):
        prefix_points("m", prompt, [(9, V)])


def pts(*spec: tuple[int, PointKind]) -> tuple[PrefixPoint, ...]:
    return tuple(PrefixPoint(n, f"h{n}", kind) for n, kind in spec)


def choose(points: tuple[PrefixPoint, ...], hit: int = 0, shared: tuple[int, ...] = (), deepest: bool = False) -> list:
    chosen = choose_cache_points(
        points,
        hit_tokens=hit,
        num_sharers=lambda h: 2 if int(h[1:]) in shared else 1,
        min_tokens=32,
        include_deepest=deepest,
    )
    return [p.num_tokens for p in chosen]


def test_cache_points_of_a_semantic_call() -> None:
    points = pts((40, V), (60, V), (90, V), (120, V))
    # The template's leading piece, always (sessions of one app share it).
    assert choose(points) == [40]
    # The longest prefix another known call shares (a generated design several roles read).
    assert choose(points, shared=(40, 60, 90)) == [40, 90]
    # An early fill caches its ready prefix: the call forks from it when it runs.
    assert choose(points, deepest=True) == [40, 120]
    # Nothing at or below what is cached already.
    assert choose(points, hit=60, shared=(90,)) == [90]
    assert choose(points, hit=120, deepest=True) == []
    # Short prefixes are never worth a context.
    assert choose(pts((10, V), (20, V)), shared=(20,), deepest=True) == []


def test_cache_points_of_plain_requests() -> None:
    chat = pts((30, M), (64, B), (70, M), (128, B), (150, M), (192, B))
    # The system prompt (first message, if long enough) and the conversation so far (last message).
    assert choose(chat) == [150]
    assert choose(pts((40, M), (64, B), (150, M), (192, B))) == [40, 150]
    # A completion has no messages: its first and its longest block prefix.
    assert choose(pts((64, B), (128, B), (192, B)), deepest=True) == [64, 192]
    assert choose(pts((64, B), (128, B), (192, B)), shared=(128,), deepest=True) == [64, 128, 192]
