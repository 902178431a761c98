"""The tokens of recently tokenized texts, found again by a later text that begins the same way.

A plain request (the OpenAI routes) carries its prompt as one string, so the system prompt of
thousands of characters that every user of an app shares arrives again, whole, with each request,
and tokenizing it whole each time would be most of the manager's CPU per request. A text's prefixes at every multiple of
`step` characters are hashed in one pass (BLAKE2b, chained); a later text that shares one of them
takes the tokens the earlier text had there, up to the prefix's stable end (Tokenizer.stable_len:
tokens no continuation can change), and only the rest is tokenized. For a tokenizer that resumes at
pre-token boundaries the result is the tokens of the whole text, exactly; the caller checks that.

A text is kept up to `max_prefix` characters (with its tokens that end there), and the texts kept
are bounded by their characters, least recently used out first. Each prefix digest names the text
that last used it (a hit re-points the shorter prefixes to the text it found), and a text no
digest names any more is dropped at once. A hash match is confirmed by comparing the texts, so a
collision costs a tokenization, never a wrong token.
"""

from __future__ import annotations

import bisect
import hashlib
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

Encoded = tuple[list[int], list[int]]  # ids, and where each token ends in the text (characters)


def stable_head(ends: Sequence[int], stable: int) -> tuple[int, int]:
    """(how many tokens end within the first `stable` characters, where the last of them ends):
    the tokens kept from a text whose first `stable` characters no continuation changes; what
    follows them is tokenized with the rest."""
    n = bisect.bisect_right(ends, stable)
    return n, ends[n - 1] if n else 0


@dataclass(eq=False)
class _Seen:
    text: str
    ids: array[int]
    ends: array[int]
    digests: list[bytes]
    cuts: dict[int, tuple[int, int]] = field(default_factory=dict)  # prefix length -> (tokens, their end)
    num_named: int = 0  # digests that name this text (0: unreachable, dropped)


class RecentTexts:
    def __init__(self, stable_len: Callable[[str], int], step: int, max_prefix: int, chars_kept: int) -> None:
        self._stable_len = stable_len
        self._step = step
        self._max_prefix = max_prefix
        self._chars_kept = chars_kept
        self._lock = threading.Lock()
        self._seen: OrderedDict[int, _Seen] = OrderedDict()  # by id(), oldest first
        self._by_digest: dict[bytes, _Seen] = {}
        self._chars = 0

    def encode_offsets(self, text: str, encode: Callable[[str], Encoded]) -> Encoded:
        """encode(text), reusing the tokens of the longest prefix (a multiple of `step`) that a
        recent text shared; the text is kept for later ones when it adds a prefix not kept yet."""
        digests = self._digests(text)
        found = self._find(text, digests)
        if found is None:
            ids, ends = encode(text)
            num_known = 0
        else:
            num_known, head_ids, head_ends, cut = found
            tail_ids, tail_ends = encode(text[cut:])
            ids, ends = head_ids + tail_ids, head_ends + [cut + end for end in tail_ends]
        if num_known < len(digests):
            kept = len(digests) * self._step  # only prefixes up to here are ever matched
            n = bisect.bisect_right(ends, kept)
            self._keep(_Seen(text[:kept], array("q", ids[:n]), array("q", ends[:n]), digests))
        return ids, ends

    @property
    def num_kept(self) -> int:
        return len(self._seen)

    @property
    def num_chars(self) -> int:
        return self._chars

    def _digests(self, text: str) -> list[bytes]:
        """The digest of text[:k * step] for every k with k * step <= min(len(text), max_prefix)."""
        h = hashlib.blake2b(digest_size=16)
        out = []
        for start in range(0, min(len(text), self._max_prefix) - self._step + 1, self._step):
            h.update(text[start : start + self._step].encode("utf-8", "surrogatepass"))
            out.append(h.copy().digest())
        return out

    def _find(self, text: str, digests: list[bytes]) -> tuple[int, list[int], list[int], int] | None:
        """(prefixes matched, the stable tokens of the longest, their ends, where they end)."""
        with self._lock:
            for k in range(len(digests), 0, -1):
                seen = self._by_digest.get(digests[k - 1])
                length = k * self._step
                if seen is None or seen.text[:length] != text[:length]:
                    continue
                cut = seen.cuts.get(length)
                if cut is None:
                    cut = seen.cuts[length] = stable_head(seen.ends, self._stable_len(seen.text[:length]))
                self._seen.move_to_end(id(seen))
                for digest in digests[: k - 1]:  # its shorter prefixes stay with the text just used
                    self._name(digest, seen)
                n, end = cut
                return k, list(seen.ids[:n]), list(seen.ends[:n]), end
        return None

    def _keep(self, seen: _Seen) -> None:
        with self._lock:
            self._seen[id(seen)] = seen
            self._chars += len(seen.text)
            for digest in seen.digests:  # the newest text holds each prefix: the oldest go first
                self._name(digest, seen)
            while self._chars > self._chars_kept and len(self._seen) > 1:
                _, old = self._seen.popitem(last=False)
                self._chars -= len(old.text)
                for digest in old.digests:
                    if self._by_digest.get(digest) is old:
                        del self._by_digest[digest]

    def _name(self, digest: bytes, seen: _Seen) -> None:
        """`digest` names `seen` now; a text it named before that no digest names is dropped."""
        before = self._by_digest.get(digest)
        if before is seen:
            return
        self._by_digest[digest] = seen
        seen.num_named += 1
        if before is not None:
            before.num_named -= 1
            if before.num_named == 0 and self._seen.pop(id(before), None) is not None:
                self._chars -= len(before.text)
