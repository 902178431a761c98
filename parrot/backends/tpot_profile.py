"""An upstream engine's capacity profile, learned from the time per output token it streams.

The builtin engine reports its step time by batched tokens (`EngineStats.step_ms_by_num_tokens`)
and the manager calibrates its latency cap from that (parrot/serve/policy/capacity.py). An engine
behind an OpenAI-compatible server shows no steps, only tokens arriving on each stream: while N
generations stream at once, each decode step adds about one token to each of them, so the gap
between two tokens of one stream is the upstream's step time with about N rows. `TpotProfile`
keeps those gaps by N (bucketed to powers of two, as the builtin engine buckets its steps) and
reports each bucket's median of its recent gaps: the decode step at that load. The median, not a
mean: a gap that holds another request's prefill (a new arrival's prompt, computed in the same
step) is an outlier here, as prefill steps are not in the builtin engine's decode buckets either.

Owned by the adapter (openai_engine.py) on its event loop; `as_dict()` may be read from another
thread (it copies under the GIL).
"""

from __future__ import annotations

import statistics
from collections import deque

WINDOW = 64  # gaps kept per bucket: recent enough to follow the upstream's load


def bucket_of(num_streams: int) -> int:
    """The power-of-two bucket a load of `num_streams` concurrent generations falls in (its upper bound)."""
    return 1 << (max(1, num_streams) - 1).bit_length()


class TpotProfile:
    def __init__(self, window: int = WINDOW) -> None:
        self._window = window
        self._gaps: dict[int, deque[float]] = {}

    def observe(self, num_streams: int, gap_ms: float, num_tokens: int = 1) -> None:
        """`num_tokens` arrived `gap_ms` after the stream's previous token while `num_streams`
        generations were streaming (a chunk of several tokens: the gap is shared among them)."""
        if num_tokens < 1 or gap_ms < 0:
            return
        gaps = self._gaps.setdefault(bucket_of(num_streams), deque(maxlen=self._window))
        gaps.extend([gap_ms / num_tokens] * num_tokens)

    def as_dict(self) -> dict[int, float]:
        """Bucket -> median ms per output token of its recent gaps (the engine's step profile)."""
        return {b: statistics.median(list(gaps)) for b, gaps in sorted(self._gaps.items()) if gaps}
