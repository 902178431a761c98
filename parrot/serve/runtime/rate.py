"""Requests per second per tenant: a token bucket each, refilled continuously."""

from __future__ import annotations

import time
from collections.abc import Callable

from parrot.protocol.errors import ParrotError


class RateLimiter:
    """Each tenant may make `rate` requests a second on average and `burst` at once; past that a
    request is refused with 429 and a Retry-After of when the next one would be accepted."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.clock = rate, burst, clock
        self._buckets: dict[str, tuple[float, float]] = {}  # tenant -> (tokens left, when counted)

    def charge(self, tenant: str) -> None:
        now = self.clock()
        tokens, then = self._buckets.get(tenant, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - then) * self.rate)
        if tokens < 1.0:
            self._buckets[tenant] = (tokens, now)
            raise ParrotError(
                f"this API key sends more than {self.rate:g} requests a second (burst {self.burst}): slow down",
                status=429,
                field="authorization",
                retry_after_s=(1.0 - tokens) / self.rate,
            )
        self._buckets[tenant] = (tokens - 1.0, now)
        if len(self._buckets) > 100_000:  # forget tenants whose buckets are full again
            self._buckets = {t: b for t, b in self._buckets.items() if b[0] + (now - b[1]) * self.rate < self.burst}
